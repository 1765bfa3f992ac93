# Shared helpers for the image build scripts in e2e/images/ (sourced, not executed).
# shellcheck shell=bash
IMAGES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${IMAGES_DIR}/../.." && pwd)"
CACHE_ROOT="${FLOWER_ADDON_CACHE:-${HOME}/.cache/flower-addon}"
IMG_CACHE="${CACHE_ROOT}/images"
# OCI archives (one per image, `ctr -n k8s.io images import` loads them) and their index.
OCI_DIR="${IMG_CACHE}/oci"
# buildah's own storage, kept in the cache (not /var/lib/containers) so it is ours alone.
# vfs: overlay-on-overlay is not available in every sandbox; vfs always works.
BUILDAH_STORAGE=(--root "${IMG_CACHE}/storage" --runroot "${IMG_CACHE}/run" --storage-driver vfs)
export STORAGE_DRIVER=vfs
# buildah would otherwise read registries.conf and may try to resolve short names remotely.
export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-oci}"

log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Installs the Debian packages named in "$@" that are missing (apt-get update once first).
ensure_debs() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q 'install ok installed' || missing+=("${p}")
  done
  (( ${#missing[@]} )) || return 0
  [[ "$(id -u)" == 0 ]] || die "missing Debian packages (${missing[*]}); install them as root"
  log "==> installing Debian packages: ${missing[*]}"
  exec 8> /var/lib/apt/.flower-addon-apt.lock
  flock 8
  if [[ ! -f "${CACHE_ROOT}/.apt-updated" ]] || [[ -n "$(find "${CACHE_ROOT}/.apt-updated" -mmin +720 2>/dev/null)" ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    mkdir -p "${CACHE_ROOT}" && touch "${CACHE_ROOT}/.apt-updated"
  fi
  apt_log="$(mktemp)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > "${apt_log}" 2>&1 \
    || { cat "${apt_log}" >&2; rm -f "${apt_log}"; die "apt-get install ${missing[*]} failed"; }
  rm -f "${apt_log}"
  exec 8>&-
}

# The Debian mirror apt already uses (first bookworm "main" archive that is not the security one),
# read from /etc/apt/sources.list and sources.list.d (one-line and deb822 formats).
debian_mirror() {
  local f uri
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "${f}" ]] || continue
    uri="$(awk '$1=="deb" && $0 ~ /bookworm([ \t]|$)/ { for (i=2;i<=NF;i++) if ($i ~ /^https?:\/\//) { print $i; exit } }' "${f}" | grep -v -- '-security' | head -n1 || true)"
    [[ -n "${uri}" ]] && { printf '%s\n' "${uri%/}"; return 0; }
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "${f}" ]] || continue
    # deb822: paragraphs separated by blank lines; pick one whose Suites has "bookworm".
    uri="$(awk 'BEGIN{RS=""; FS="\n"} {u=""; s=""; for (i=1;i<=NF;i++) { if ($i ~ /^URIs:/) u=$i; if ($i ~ /^Suites:/) s=$i }
            if (s ~ /[ \t]bookworm([ \t]|$)/ && u !~ /security/) { sub(/^URIs:[ \t]*/, "", u); split(u, a, /[ \t]+/); print a[1]; exit } }' "${f}")"
    [[ -n "${uri}" ]] && { printf '%s\n' "${uri%/}"; return 0; }
  done
  die "no Debian bookworm mirror found in /etc/apt/sources.list*"
}

# sha256 of the given files' contents and of extra strings (the stamp of a build's inputs).
inputs_hash() {
  { for f in "$@"; do
      if [[ -f "${f}" ]]; then printf 'file %s\n' "${f#"${REPO_ROOT}"/}"; cat "${f}"; else printf 'str %s\n' "${f}"; fi
    done; } | sha256sum | cut -d' ' -f1
}

# Takes an exclusive lock on "$1" (fd 9), saying so if another caller holds it.
lock_or_wait() {
  mkdir -p "$(dirname "$1")"
  exec 9> "$1"
  if ! flock -n 9; then
    log "==> another build holds $1; waiting for it"
    flock 9
  fi
}

bah() { buildah "${BUILDAH_STORAGE[@]}" "$@"; }

# Whether image "$1" exists in our buildah storage.
have_image() { bah inspect --type image "$1" >/dev/null 2>&1; }

# Exports image "$1" to "${OCI_DIR}/$2.tar" (oci-archive, tagged with "$1").
export_image() {
  local ref="$1" file="${OCI_DIR}/$2.tar"
  mkdir -p "${OCI_DIR}"
  rm -f "${file}.tmp"
  bah push --quiet "${ref}" "oci-archive:${file}.tmp:${ref}" >&2
  mv -f "${file}.tmp" "${file}"
}

# Makes image "$1" available in buildah's storage, restoring it from "${OCI_DIR}/$2.tar" when the
# storage was pruned (build.sh keeps only the OCI archives between runs: vfs stores every layer
# as a full copy, several GB for these images).
need_image() {
  local ref="$1" file="${OCI_DIR}/$2.tar" id
  have_image "${ref}" && return 0
  [[ -f "${file}" ]] || die "${ref} is neither in buildah's storage nor in ${file}"
  id="$(bah pull --quiet "oci-archive:${file}")"
  bah tag "${id}" "${ref}"
}
