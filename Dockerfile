# Build stage: the Go toolchain and the module cache stay here.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/jetgres ./cmd/jetgres

# Runtime stage: Debian with PostgreSQL's server binaries, so that
# `docker run -p 4222:4222 -p 8080:8080 <image>` needs no database: jetgres runs its private
# cluster in the volume /var/lib/jetgres. With --database-url (docker-compose.yml gives one)
# the binaries go unused. postgresql-common is told not to make a cluster of its own.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-common \
 && sed -i 's/^#\?create_main_cluster.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o postgres -g postgres -m 0700 /var/lib/jetgres
COPY --from=build /out/jetgres /usr/local/bin/jetgres
# Not root: jetgres and the PostgreSQL it starts run as the package's postgres user, which owns
# the data volume.
USER postgres
WORKDIR /var/lib/jetgres
ENV JETGRES_DATA_DIR=/var/lib/jetgres
# Inside a container, loopback would hide /readyz and /metrics from the published port.
ENV JETGRES_HTTP=0.0.0.0:8080
VOLUME /var/lib/jetgres
EXPOSE 4222 8080
ENTRYPOINT ["/usr/local/bin/jetgres"]
CMD ["serve"]
