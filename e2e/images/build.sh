#!/usr/bin/env bash
# Build (once) every container image the real-node e2e tests load into containerd:
#   debian:bookworm-slim              local stand-in made with mmdebstrap (minbase) from the
#                                     Debian mirror apt already uses; the base of all the others
#   registry.k8s.io/pause:3.10.2      the pod sandbox image (pause/pause.c, gcc -static)
#   flwr/{base,superlink,supernode,superexec}:V   for V in FLWR_VERSIONS (1.42.0 1.25.0): same
#                                     names, entrypoints, user, workdir as Flower's images
#   flower-addon/fedavg:V             examples/fedavg on flwr/superexec:V (process isolation)
#   ghcr.io/flower-addon/flower-addon:<cargo version>   the repository's own Dockerfile
#   ghcr.io/flower-addon/flower-addon:<cargo version>-rebuilt   the same Dockerfile and binaries
#                                     built a second time under another tag: what the rolling
#                                     upgrade of the real-node tests upgrades to
#
# Output: one OCI archive per image in ${FLOWER_ADDON_CACHE:-$HOME/.cache/flower-addon}/images/oci/
# and an index (images.tsv: reference, archive); stdout gets exactly one line, that directory.
# Each image has a stamp hashing its inputs; an unchanged image is skipped. flock serializes
# parallel callers. Missing Debian packages (buildah, mmdebstrap, gcc, libc6-dev) are installed.
#
# Usage: build.sh [--only NAME]... [--force]
#   NAME: base pause flwr app addon   (default: all)
# Environment: FLWR_VERSIONS ("1.42.0 1.25.0"), FLOWER_ADDON_BIN_DIR (target/release or
#   target/debug, relative to the repository or absolute, default: whichever holds both binaries, release first; stripped copies go to
#   target/image/ and the repo Dockerfile is built with --build-arg BIN_DIR=target/image).
set -euo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

FLWR_VERSIONS="${FLWR_VERSIONS:-1.42.0 1.25.0}"
PYTHON="${PYTHON:-python3}"
PAUSE_REF="registry.k8s.io/pause:3.10.2"
ADDON_VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "${REPO_ROOT}/Cargo.toml")"
ADDON_REF="ghcr.io/flower-addon/flower-addon:${ADDON_VERSION}"
ADDON_REBUILT_REF="${ADDON_REF}-rebuilt"
BASE_REF="docker.io/library/debian:bookworm-slim"

only=() force=0
while (( $# )); do
  case "$1" in
    --only) only+=("$2"); shift ;;
    --force) force=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
  shift
done
wanted() { (( ${#only[@]} == 0 )) && return 0; local o; for o in "${only[@]}"; do [[ "$o" == "$1" ]] && return 0; done; return 1; }

# runc: buildah runs RUN steps with it, and its package only recommends one (a fresh machine has
# none until e2e/node/build.sh installs containerd's, which these builds do not wait for).
ensure_debs buildah runc mmdebstrap gcc libc6-dev iptables uidmap
lock_or_wait "${IMG_CACHE}/.build.lock"
mkdir -p "${IMG_CACHE}/stamps" "${OCI_DIR}"
T_ALL=${SECONDS}
TIMINGS=()

# up_to_date NAME HASH ARCHIVE...: the stamp matches and every archive exists.
up_to_date() {
  local name="$1" hash="$2"; shift 2
  (( force )) && return 1
  [[ -f "${IMG_CACHE}/stamps/${name}" && "$(cat "${IMG_CACHE}/stamps/${name}")" == "${hash}" ]] || return 1
  local a; for a in "$@"; do [[ -f "${OCI_DIR}/${a}.tar" ]] || return 1; done
}
stamp() { printf '%s\n' "$2" > "${IMG_CACHE}/stamps/$1"; }
timed() {  # timed LABEL START: records "LABEL Ns"
  TIMINGS+=("$1 $(( SECONDS - $2 ))s")
}
# bud ARGS...: buildah bud without network (a network build leaves NETAVARK chains behind).
bud() { bah bud --quiet --pull=never --network=none --layers=false "$@" >&2; }

# ---- base: debian:bookworm-slim from mmdebstrap -------------------------------------------------
MIRROR="$(debian_mirror)"
# The base's recipe is the mmdebstrap call below: bump BASE_RECIPE when changing it (hashing this
# script would rebuild every image for any edit).
BASE_RECIPE="mmdebstrap-minbase-bookworm-slim-v1"
base_hash="$(inputs_hash "${BASE_RECIPE}" "${MIRROR}")"
if wanted base || wanted flwr || wanted app || wanted addon; then
  # --force rebuilds the base only when it was asked for (--only base, or everything).
  base_force=${force}; wanted base || force=0
  if up_to_date base "${base_hash}" debian-bookworm-slim; then
    log "==> base ${BASE_REF}: cached"
  else
    t0=${SECONDS}
    log "==> base ${BASE_REF}: mmdebstrap --variant=minbase bookworm from ${MIRROR} (cold ~1-2 min)"
    tarball="${IMG_CACHE}/debian-bookworm-slim.rootfs.tar"
    rm -f "${tarball}"
    # As the official slim image: no docs, man pages or locales.
    mmdebstrap --quiet --variant=minbase --mode=root --format=tar \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/info/*' \
      --aptopt='Acquire::Languages "none"' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log' \
      bookworm "${tarball}" "deb ${MIRROR} bookworm main" "deb ${MIRROR} bookworm-updates main" >&2
    bah rmi --force "${BASE_REF}" localhost/debian:bookworm-slim >/dev/null 2>&1 || true
    ctr_id="$(bah from --quiet scratch)"
    bah add --quiet "${ctr_id}" "${tarball}" / >&2
    bah config --cmd '["bash"]' --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --os linux --arch amd64 "${ctr_id}" >&2
    bah commit --quiet --rm "${ctr_id}" "${BASE_REF}" >/dev/null
    bah tag "${BASE_REF}" localhost/debian:bookworm-slim
    rm -f "${tarball}"
    export_image "${BASE_REF}" debian-bookworm-slim
    stamp base "${base_hash}"
    timed base "${t0}"
    log "    base done in $(( SECONDS - t0 ))s"
  fi
  force=${base_force}
fi

# ---- pause ------------------------------------------------------------------------------------
pause_hash="$(inputs_hash "${IMAGES_DIR}/pause/pause.c" "${IMAGES_DIR}/pause/Dockerfile" "${PAUSE_REF}")"
if wanted pause; then
  if up_to_date pause "${pause_hash}" pause; then
    log "==> ${PAUSE_REF}: cached"
  else
    t0=${SECONDS}
    log "==> ${PAUSE_REF}: gcc -static pause.c + FROM scratch (seconds)"
    ctx="$(mktemp -d)"; trap 'rm -rf "${ctx}"' EXIT
    mkdir -p "${ctx}/bin"
    gcc -Os -static -Wall -Werror -o "${ctx}/bin/pause" "${IMAGES_DIR}/pause/pause.c"
    strip "${ctx}/bin/pause"
    cp "${IMAGES_DIR}/pause/Dockerfile" "${ctx}/Dockerfile"
    bud -t "${PAUSE_REF}" "${ctx}"
    rm -rf "${ctx}"; trap - EXIT
    export_image "${PAUSE_REF}" pause
    stamp pause "${pause_hash}"
    timed pause "${t0}"
  fi
fi

# ---- Flower images ------------------------------------------------------------------------------
for v in ${FLWR_VERSIONS}; do
  flwr_hash="$(inputs_hash "${base_hash}" "${IMAGES_DIR}"/flwr/*.Dockerfile "${v}")"
  if wanted flwr; then
    if up_to_date "flwr-${v}" "${flwr_hash}" "flwr-superlink-${v}" "flwr-supernode-${v}" "flwr-superexec-${v}"; then
      log "==> flwr/{superlink,supernode,superexec}:${v}: cached"
    else
      t0=${SECONDS}
      wheels="${IMG_CACHE}/wheels/flwr-${v}"
      if [[ ! -f "${wheels}/.complete" ]]; then
        log "==> flwr ${v}: pip download flwr==${v} wheels on the host (uses the host's pip settings)"
        "${PYTHON}" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
          || die "${PYTHON} is not Python 3.11 (Debian bookworm's): its wheels would not fit; set PYTHON"
        rm -rf "${wheels}"
        "${PYTHON}" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
          -d "${wheels}" "flwr==${v}" >&2
        touch "${wheels}/.complete"
      fi
      log "==> flwr/base:${v}: apt-get python3 + pip install flwr==${v} from those wheels (cold ~1-2 min)"
      need_image "${BASE_REF}" debian-bookworm-slim
      # The only networked build step (apt-get from the Debian mirror; pip is offline).
      # --network=host: no bridge and no NAT (NETAVARK) chains are made for the build.
      bah bud --quiet --pull=never --network=host --layers=false \
        -v "${wheels}:/wheels:ro" --build-arg "PIP_OPTS=--no-index --find-links /wheels" \
        --build-arg "FLWR_VERSION=${v}" -t "docker.io/flwr/base:${v}" \
        -f "${IMAGES_DIR}/flwr/base.Dockerfile" "${IMAGES_DIR}/flwr" >&2
      # Smoke check: the three entrypoints run as user app from /app (argparse --help exits 0).
      bah run --network=none "$(bah from --quiet --pull=never "docker.io/flwr/base:${v}")" -- sh -c \
        'test "$(id -un)" = app && test "$PWD" = /app && flower-superlink --help >/dev/null && flower-supernode --help >/dev/null && flower-superexec --help >/dev/null' \
        || die "flwr/base:${v}: flower-superlink/supernode/superexec --help failed"
      bah rm --all >/dev/null
      for c in superlink supernode superexec; do
        log "    flwr/${c}:${v}"
        bud --build-arg "BASE_IMAGE=${v}" -t "docker.io/flwr/${c}:${v}" \
          -f "${IMAGES_DIR}/flwr/${c}.Dockerfile" "${IMAGES_DIR}/flwr"
        ep="$(bah inspect --type image --format '{{.OCIv1.Config.Entrypoint}} {{.OCIv1.Config.User}} {{.OCIv1.Config.WorkingDir}}' "docker.io/flwr/${c}:${v}")"
        [[ "${ep}" == "[flower-${c}] app /app" ]] || die "flwr/${c}:${v}: entrypoint, user, workdir are '${ep}'"
        export_image "docker.io/flwr/${c}:${v}" "flwr-${c}-${v}"
      done
      stamp "flwr-${v}" "${flwr_hash}"
      timed "flwr-${v}" "${t0}"
      log "    flwr ${v} done in $(( SECONDS - t0 ))s"
    fi
  fi
  app_hash="$(inputs_hash "${flwr_hash}" "${IMAGES_DIR}/app/Dockerfile" \
    $(find "${REPO_ROOT}/examples/fedavg" -type f -not -path '*/.flwr/*' -not -name '*.pyc' | sort))"
  if wanted app; then
    if up_to_date "app-${v}" "${app_hash}" "fedavg-${v}"; then
      log "==> flower-addon/fedavg:${v}: cached"
    else
      t0=${SECONDS}
      log "==> flower-addon/fedavg:${v} (examples/fedavg on flwr/superexec:${v})"
      need_image "docker.io/flwr/superexec:${v}" "flwr-superexec-${v}"
      bud --build-arg "SUPEREXEC_IMAGE=docker.io/flwr/superexec:${v}" -t "docker.io/flower-addon/fedavg:${v}" \
        -f "${IMAGES_DIR}/app/Dockerfile" "${REPO_ROOT}/examples"
      export_image "docker.io/flower-addon/fedavg:${v}" "fedavg-${v}"
      stamp "app-${v}" "${app_hash}"
      timed "app-${v}" "${t0}"
    fi
  fi
done

# ---- our image: the repository's Dockerfile -------------------------------------------------------
if wanted addon; then
  bin_dir="${FLOWER_ADDON_BIN_DIR:-}"
  if [[ -z "${bin_dir}" ]]; then
    for d in target/release target/debug; do
      [[ -x "${REPO_ROOT}/${d}/flower-hub" && -x "${REPO_ROOT}/${d}/flower-agent" ]] && { bin_dir="${d}"; break; }
    done
  fi
  # An absolute FLOWER_ADDON_BIN_DIR is taken as it is; a relative one from the repository root.
  [[ "${bin_dir}" == /* ]] && bin_dir="$(realpath --relative-to="${REPO_ROOT}" "${bin_dir}")"
  [[ -n "${bin_dir}" && -x "${REPO_ROOT}/${bin_dir}/flower-hub" && -x "${REPO_ROOT}/${bin_dir}/flower-agent" ]] \
    || die "no flower-hub/flower-agent in target/release or target/debug: run cargo build --release --bins (or set FLOWER_ADDON_BIN_DIR)"
  # Stripped copies in target/image/ (a debug build's binaries are ~600 MB with debug info; the
  # Dockerfile is the same, only its BIN_DIR build argument points there).
  stage="${REPO_ROOT}/target/image"
  mkdir -p "${stage}"
  for b in flower-hub flower-agent; do
    if [[ ! -f "${stage}/${b}" || "${REPO_ROOT}/${bin_dir}/${b}" -nt "${stage}/${b}" ]]; then
      strip --strip-debug -o "${stage}/${b}.tmp" "${REPO_ROOT}/${bin_dir}/${b}"
      mv -f "${stage}/${b}.tmp" "${stage}/${b}"
    fi
  done
  addon_hash="$(inputs_hash "${base_hash}" "${REPO_ROOT}/Dockerfile" "${REPO_ROOT}/.dockerignore" "${ADDON_REF}" \
    "${stage}/flower-hub" "${stage}/flower-agent")"
  if up_to_date addon "${addon_hash}" flower-addon flower-addon-rebuilt; then
    log "==> ${ADDON_REF} and ${ADDON_REBUILT_REF} (Dockerfile, ${bin_dir}): cached"
  else
    t0=${SECONDS}
    log "==> ${ADDON_REF}: buildah bud the repository Dockerfile with ${bin_dir}'s binaries (BIN_DIR=target/image)"
    need_image "${BASE_REF}" debian-bookworm-slim
    bud --build-arg "BIN_DIR=target/image" -t "${ADDON_REF}" -f "${REPO_ROOT}/Dockerfile" "${REPO_ROOT}"
    export_image "${ADDON_REF}" flower-addon
    # A second build, not a second name for the first one: an upgrade to another image.
    log "==> ${ADDON_REBUILT_REF}: the same Dockerfile built again (the rolling upgrade's target)"
    bud --build-arg "BIN_DIR=target/image" -t "${ADDON_REBUILT_REF}" -f "${REPO_ROOT}/Dockerfile" "${REPO_ROOT}"
    export_image "${ADDON_REBUILT_REF}" flower-addon-rebuilt
    stamp addon "${addon_hash}"
    timed addon "${t0}"
  fi
fi

# ---- index: every archive present (also those of Flower versions not built by this call) ------
{
  for f in "${OCI_DIR}"/*.tar; do
    [[ -f "${f}" ]] || continue
    name="$(basename "${f}" .tar)"
    case "${name}" in
      debian-bookworm-slim) ref="${BASE_REF}" ;;
      pause) ref="${PAUSE_REF}" ;;
      flower-addon) ref="${ADDON_REF}" ;;
      flower-addon-rebuilt) ref="${ADDON_REBUILT_REF}" ;;
      flwr-*-*) c="${name#flwr-}"; ref="docker.io/flwr/${c%%-*}:${c#*-}" ;;
      fedavg-*) ref="docker.io/flower-addon/fedavg:${name#fedavg-}" ;;
      *) continue ;;
    esac
    printf '%s\t%s\n' "${ref}" "${name}.tar"
  done
} > "${OCI_DIR}/images.tsv.tmp"
mv -f "${OCI_DIR}/images.tsv.tmp" "${OCI_DIR}/images.tsv"
# Keep only the OCI archives: buildah's vfs storage holds a full copy of every layer (~5 GB for
# these images); need_image restores a parent from its archive when a later build needs it.
bah rm --all >/dev/null 2>&1 || true
bah rmi --all --force >/dev/null 2>&1 || true
log "==> images done in $(( SECONDS - T_ALL ))s${TIMINGS[*]:+: ${TIMINGS[*]}}"
printf '%s\n' "${OCI_DIR}"
