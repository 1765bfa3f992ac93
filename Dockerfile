# flower-addon: one image with both binaries, flower-hub (the default entrypoint) and flower-agent.
#
# Build the binaries first, then the image (the context is the repository root; .dockerignore
# sends only the two binaries):
#
#   cargo build --profile dist -p flower-addon-hub -p flower-addon-agent
#   docker build -t ghcr.io/flower-addon/flower-addon:0.1.0 .        # or: podman build / buildah bud
#
# manifests/hub and manifests/agent name this reference with imagePullPolicy: IfNotPresent, so a
# cluster without a registry runs it once loaded (kind load docker-image …, or
# docker save … | ctr -n k8s.io images import -). The agent Deployment overrides the command
# (flower-agent). --build-arg BIN_DIR=DIR takes the binaries from another directory under the
# context (target/release after `cargo build --release --bins`; e2e/images/build.sh uses
# target/image: stripped copies of a debug build, saving CI a release compile; the Dockerfile is
# otherwise the same).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ARG BIN_DIR=target/dist
# Only the binaries: no package manager step, so the image needs no network to build and carries
# nothing but the Debian base (libc, ca-certificates are not needed: TLS roots come from the hub CA).
COPY ${BIN_DIR}/flower-hub ${BIN_DIR}/flower-agent /usr/local/bin/
# The distroless "nonroot" uid/gid, as the Deployments' securityContext expects.
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/usr/local/bin/flower-hub"]
