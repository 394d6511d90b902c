# Build stage: the Go toolchain and the module cache stay here.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/jetgres ./cmd/jetgres

# Runtime stage: a static binary on a minimal base, running as an unprivileged user. The image
# has no PostgreSQL binaries, so it needs --database-url (docker-compose.yml gives one).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/jetgres /usr/local/bin/jetgres
WORKDIR /home/nonroot
EXPOSE 4222 8080
ENTRYPOINT ["/usr/local/bin/jetgres"]
CMD ["serve"]
