# As Flower's framework/docker/superlink/Dockerfile: the base image plus the entrypoint.
ARG BASE_REPOSITORY=flwr/base
ARG BASE_IMAGE
FROM $BASE_REPOSITORY:$BASE_IMAGE

ENTRYPOINT ["flower-superlink"]
