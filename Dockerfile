# Portcullis as a container: build with the Rust toolchain, run the binary alone.
#
#   docker build -t portcullis .          (or: podman build --format docker -t portcullis .)
#   docker run -p 8080:8080 -p 9090:9090 --read-only \
#     -v $PWD/deploy/compose/portcullis.toml:/etc/portcullis/portcullis.toml:ro \
#     -v portcullis-state:/var/lib/portcullis \
#     -e PORTCULLIS_ADMIN_TOKEN_SHA256=... -e AGENT_KEY=... portcullis
#
# The configuration is read from /etc/portcullis/portcullis.toml. Inside a container the
# listeners must bind 0.0.0.0, and an admin listener off loopback needs an admin token
# (`admin_token_sha256`); see deploy/. State (pins, audit) belongs under the volume
# /var/lib/portcullis; the root filesystem can be read-only.

# Where the binary comes from: `build` (the default) compiles it from the sources in the
# context; `host` takes one built already on a machine of the same Debian release, from
# the extra build context `host-binary`, a directory holding `portcullis`:
#
#   podman build --build-arg BINARY=host --build-context host-binary=DIR -t portcullis .
#
# Only the stages the chosen path needs are built, so `host` compiles nothing.
ARG BINARY=build

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
# The whole package is copied: Cargo refuses a manifest whose declared targets (the
# [[bench]]es) are missing, so a stub stage written by hand drifts from Cargo.toml.
# Cache mounts (BuildKit, Buildah) keep the registry and the target directory between
# builds instead, so a source change rebuilds only the crate. COPY keeps the files'
# times, older than a cached build's outputs: the crate's roots are touched so that
# cargo never takes a cached binary for the sources copied in.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    touch src/lib.rs src/main.rs \
    && cargo build --release --locked --bin portcullis \
    && mkdir -p /out && cp target/release/portcullis /out/portcullis

FROM docker.io/library/rust:1.95-bookworm AS host
COPY --from=host-binary portcullis /out/portcullis

FROM ${BINARY} AS binary

FROM docker.io/library/rust:1.95-bookworm AS rootfs
COPY --from=binary /out/portcullis /usr/local/bin/portcullis
# The runtime's whole file system: the binary, the shared libraries it links (as ldd
# names them, whatever the architecture), CA certificates for TLS upstreams, the user,
# and the state directory it owns. No shell, no package manager.
RUN strip /usr/local/bin/portcullis \
    && mkdir -p /rootfs/usr/local/bin /rootfs/etc/ssl/certs /rootfs/etc/portcullis \
        /rootfs/var/lib/portcullis /rootfs/tmp \
    && cp /usr/local/bin/portcullis /rootfs/usr/local/bin/ \
    && ldd /usr/local/bin/portcullis | grep -o '/[^ ]*' | xargs -I{} cp -L --parents {} /rootfs/ \
    && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ \
    && echo 'portcullis:x:10001:10001:Portcullis:/var/lib/portcullis:/nonexistent' > /rootfs/etc/passwd \
    && echo 'portcullis:x:10001:' > /rootfs/etc/group \
    && chown 10001:10001 /rootfs/var/lib/portcullis \
    && chmod 1777 /rootfs/tmp

FROM scratch
COPY --from=rootfs /rootfs/ /
USER 10001:10001
VOLUME /var/lib/portcullis
# 8080: MCP clients (/mcp/<server>). 9090: admin (/healthz, /readyz, /api/...).
EXPOSE 8080 9090
ENV PORTCULLIS_CONFIG=/etc/portcullis/portcullis.toml
# `portcullis health` probes the /healthz of the admin listener PORTCULLIS_CONFIG names.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/portcullis", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/portcullis"]
CMD ["run", "--config", "/etc/portcullis/portcullis.toml"]
