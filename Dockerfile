# elastrec's container image: the `elastrec` binary on a slim Debian, for the Kubernetes
# backend (`elastrec run --backend kubernetes`, `engine.kubernetes.image`) and for running
# any subcommand in a container.
#
#   docker build -t elastrec .
#   docker run --rm elastrec train --help
#
# The build stage needs nothing beyond the Rust image: no cmake, no C library headers.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p elastrec-cli \
    && cp target/release/elastrec /elastrec

FROM debian:bookworm-slim AS runtime
# CA roots for TLS to object storage, Kafka and the Kubernetes API; tini reaps the node
# processes a master starts.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --home-dir /home/elastrec elastrec
COPY --from=build /elastrec /usr/local/bin/elastrec
# A non-root user with a numeric id: namespaces under Pod Security "restricted" accept it.
USER 10001
WORKDIR /home/elastrec
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/elastrec"]
CMD ["--help"]
