# syntax=docker/dockerfile:1
# Caret's image: `caret` built from source with the lock file, on Debian, with the default
# embedding model pulled (verified by SHA-256) at build time. The build stage installs what
# .ci/run installs for the build (cmake, clang and libclang for llama.cpp, Node.js and npm for
# the workspace page) and runs the same `cargo build --locked`.
#
#   docker build -t caret .
#   docker run -p 7878:7878 caret serve --addr 0.0.0.0:7878 --allow-insecure-http

FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends cmake clang libclang-dev \
 && rm -rf /var/lib/apt/lists/*
# Node.js 20 for the page's bundle (Debian's is older than Vite needs).
COPY --from=node:20-bookworm-slim /usr/local/bin/node /usr/local/bin/node
COPY --from=node:20-bookworm-slim /usr/local/lib/node_modules /usr/local/lib/node_modules
RUN ln -s /usr/local/lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p caret \
 && install -m 0755 target/release/caret /usr/local/bin/caret

FROM debian:bookworm-slim
# bubblewrap: the agents' and workers' sandbox; git: checkouts; ca-certificates: TLS upstreams.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      bubblewrap ca-certificates curl git python3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /var/lib/caret --uid 10001 caret
COPY --from=build /usr/local/bin/caret /usr/local/bin/caret
USER caret
ENV CARET_HOME=/var/lib/caret
RUN caret models pull
EXPOSE 7878
HEALTHCHECK --interval=10s --timeout=3s CMD curl -fsS http://127.0.0.1:7878/healthz || exit 1
ENTRYPOINT ["caret"]
CMD ["serve", "--addr", "0.0.0.0:7878", "--allow-insecure-http"]
