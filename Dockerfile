# Portcullis as a container: build with the Rust toolchain, run the binary alone.
#
#   docker build -t portcullis .
#   docker run -p 8080:8080 -p 9090:9090 \
#     -v $PWD/deploy/compose/portcullis.toml:/etc/portcullis/portcullis.toml:ro \
#     -e PORTCULLIS_ADMIN_TOKEN_SHA256=... -e AGENT_KEY=... portcullis
#
# The configuration is read from /etc/portcullis/portcullis.toml. Inside a container the
# listeners must bind 0.0.0.0, and an admin listener off loopback needs an admin token
# (`admin_token_sha256`); see deploy/.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && for b in policy_and_validation pinning sanitize; do echo 'fn main() {}' > benches/$b.rs; done \
    && cargo build --release --locked --bin portcullis \
    && rm -rf src benches
COPY src ./src
COPY benches ./benches
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin portcullis \
    && strip target/release/portcullis

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 portcullis \
    && useradd --system --uid 10001 --gid portcullis --no-create-home --shell /usr/sbin/nologin portcullis \
    && mkdir -p /etc/portcullis /var/lib/portcullis \
    && chown portcullis:portcullis /var/lib/portcullis
COPY --from=build /src/target/release/portcullis /usr/local/bin/portcullis
USER 10001:10001
# 8080: MCP clients (/mcp/<server>). 9090: admin (/healthz, /readyz, /api/...).
EXPOSE 8080 9090
ENV PORTCULLIS_CONFIG=/etc/portcullis/portcullis.toml
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/portcullis", "health", "--url", "http://127.0.0.1:9090/healthz"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/portcullis"]
CMD ["run", "--config", "/etc/portcullis/portcullis.toml"]
