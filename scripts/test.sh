#!/usr/bin/env bash
# Every test, on a fresh machine: installs what the tests need beyond Rust, then runs
# `cargo test --workspace` (extra arguments are passed to it). The deploy example's tests
# build examples/deploy, a crate outside the workspace, into target/deploy-example.
#
# - Debian's chromium and chromium-driver, for the console's browser tests
#   (crates/lab/tests/console.rs and deploy.rs), with apt-get when missing;
# - schemathesis from PyPI (pinned, in target/schemathesis-VERSION), for the API's check
#   against its OpenAPI document (crates/lab/tests/deploy.rs);
# - Debian's postgresql-15, for the PostgreSQL backend's tests: each such test starts a
#   private server of its own on a free loopback port and stops it when it ends
#   (durafiber-testkit's `postgres::PgServer`; `DURAFIBER_PG_URL` points them at a running one).
#
# Nothing is skipped: a test whose tool is missing fails.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "test.sh: installing chromium and chromium-driver for the browser tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! as_root apt-get install -y -qq chromium chromium-driver >/dev/null; then
        as_root apt-get update -qq
        as_root apt-get install -y -qq chromium chromium-driver >/dev/null
    fi
fi

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "test.sh: installing postgresql-15 for the PostgreSQL backend's tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! as_root apt-get install -y -qq postgresql-15 >/dev/null; then
        as_root apt-get update -qq
        as_root apt-get install -y -qq postgresql-15 >/dev/null
    fi
fi

# schemathesis, pinned, in a virtual environment of its own: the deploy example's test runs
# it against a real `serve` and fails on any difference between the API and its document.
SCHEMATHESIS_VERSION=4.32.5
venv="target/schemathesis-${SCHEMATHESIS_VERSION}"
# A virtual environment names its interpreter by absolute path: one that moved with its
# target directory is made anew.
if ! "$venv/bin/schemathesis" --version >/dev/null 2>&1; then
    echo "test.sh: installing schemathesis ${SCHEMATHESIS_VERSION} into $venv" >&2
    rm -rf "$venv"
    mkdir -p target
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "schemathesis==${SCHEMATHESIS_VERSION}"
fi
export DURAFIBER_SCHEMATHESIS="$PWD/$venv/bin/schemathesis"

# The API reference is rustdoc: a broken or private link fails the run like a failed test.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --quiet

# A clean run (CI) builds every crate once, so incremental state would only take disk
# (1.6 GB of the target); CARGO_INCREMENTAL=1 keeps it for repeated local runs.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
exec cargo test --workspace "$@"
