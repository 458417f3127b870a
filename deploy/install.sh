#!/bin/sh
# Install modstage on a Debian 12 / 13 or Ubuntu 24.04 host the way those hosts install a service
# that is not packaged: its own virtual environment (PEP 668: no pip into the system Python).
#
#   sudo deploy/install.sh                    # install or upgrade, enable, start the daemon
#   sudo deploy/install.sh --uninstall        # remove what it installed, keep config and state
#   sudo deploy/install.sh --uninstall --purge   # ... and /etc/modstage, /var/lib/modstage
#
# Options: --root DIR (install into a tree, for images and tests; nothing is started),
# --from PATH (a wheel or source tree; default: this checkout), --wheels DIR (install
# offline from a wheelhouse), --python PY (default /usr/bin/python3, 3.11 or later),
# --no-start (enable, but do not start the daemon now).
#
# What it installs (and the list it keeps in /opt/modstage/share/modstage/installed):
#   /opt/modstage/                       the venv: modstage and its dependencies
#   /usr/local/bin/modstage              a link to /opt/modstage/bin/modstage
#   /usr/local/lib/systemd/system/modstage{,-boot}.service, enabled
#   /etc/modstage/config.toml            deploy/config.example.toml, only if absent
#   /etc/modstage/trusted.d/             created empty if absent
#   /etc/kernel/postinst.d/zzz-modstage, /etc/kernel/postrm.d/zzz-modstage   the kernel hook
#                                        (deploy/kernel/zzz-modstage: run by a kernel package)
# The boot unit is enabled, never started here: it loads modules, which happens at boot.
set -eu

VENV=/opt/modstage
LINK=/usr/local/bin/modstage
UNITDIR=/usr/local/lib/systemd/system
UNITS="modstage-boot.service modstage.service"
HOOKS="/etc/kernel/postinst.d/zzz-modstage /etc/kernel/postrm.d/zzz-modstage"
SRC=$(cd "$(dirname "$0")/.." && pwd)

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

parse() {
    ROOT=/ FROM=$SRC WHEELS= PY=/usr/bin/python3 START=yes ACTION=install PURGE=no
    while [ $# -gt 0 ]; do
        case "$1" in
            --root) ROOT=${2:?--root needs a directory}; shift ;;
            --from) FROM=${2:?--from needs a wheel or a source tree}; shift ;;
            --wheels) WHEELS=${2:?--wheels needs a directory}; shift ;;
            --python) PY=${2:?--python needs an interpreter}; shift ;;
            --no-start) START=no ;;
            --uninstall) ACTION=uninstall ;;
            --purge) PURGE=yes ;;
            -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
            *) die "unknown argument: $1 (see --help)" ;;
        esac
        shift
    done
    ROOT=$(cd "$ROOT" 2>/dev/null && pwd) || die "--root: no such directory"
    DEST=${ROOT%/}
    [ "$PURGE" = no ] || [ "$ACTION" = uninstall ] || die "--purge goes with --uninstall"
    [ "$DEST" != "" ] || [ "$(id -u)" = 0 ] || die "run as root (or with --root DIR)"
}

check_python() {
    [ -x "$PY" ] || die "$PY is missing: apt-get install python3"
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "$PY is older than 3.11"
    "$PY" -c 'import ensurepip, venv' 2>/dev/null \
        || die "$PY cannot make a venv: apt-get install python3-venv"
}

# Build the venv beside the old one, relocate it to its final path, then swap.
build_venv() {
    stage=$DEST/opt/.modstage.new
    rm -rf "$stage"
    mkdir -p "$DEST/opt"
    "$PY" -m venv "$stage"
    set -- --no-compile --disable-pip-version-check --quiet
    [ -z "$WHEELS" ] || set -- "$@" --no-index --find-links "$WHEELS"
    from=$(cd "$(dirname "$FROM")" && pwd)/$(basename "$FROM")
    "$stage/bin/python" -m pip install "$@" "modstage[host] @ file://$from" \
        || die "pip could not install modstage from $FROM"
    relocate "$stage" "$VENV"
    if [ -e "$DEST$VENV" ]; then
        rm -rf "$DEST/opt/.modstage.old"
        mv "$DEST$VENV" "$DEST/opt/.modstage.old"
    fi
    mv "$stage" "$DEST$VENV"
    rm -rf "$DEST/opt/.modstage.old"
}

# A venv records its own path (script shebangs, activate, pyvenv.cfg, .pyc file names):
# rewrite it from where it was built to where it will run.
relocate() {
    built=$1 final=$2
    for f in "$built"/bin/*; do
        [ -f "$f" ] && [ ! -L "$f" ] || continue
        if head -n1 "$f" | grep -q "^#!$built/bin/python" || grep -Iq "$built" "$f"; then
            sed -i "s|$built|$final|g" "$f"
        fi
    done
    sed -i "s|$built|$final|g" "$built/pyvenv.cfg"
    "$built/bin/python" -m compileall -q -f -j0 -s "$built" -p "$final" "$built/lib" >/dev/null
}

install_files() {
    doc=$DEST$VENV/share/doc/modstage
    mkdir -p "$doc" "$DEST$VENV/share/modstage" "$DEST$UNITDIR" "$DEST$(dirname "$LINK")"
    cp "$SRC/README.md" "$doc/README.md"
    cp "$SRC/deploy/README.md" "$doc/deploy.md"
    if [ -e "$DEST$LINK" ] && [ ! -L "$DEST$LINK" ]; then
        die "$LINK exists and is not our link; remove it first"
    fi
    ln -sfn "$VENV/bin/modstage" "$DEST$LINK"
    for unit in $UNITS; do
        cp "$SRC/deploy/systemd/$unit" "$DEST$UNITDIR/$unit"
        chmod 0644 "$DEST$UNITDIR/$unit"
    done
    for hook in $HOOKS; do
        mkdir -p "$DEST$(dirname "$hook")"
        cp "$SRC/deploy/kernel/zzz-modstage" "$DEST$hook"
        chmod 0755 "$DEST$hook"
    done
    install_config
    {
        echo "$LINK"
        for unit in $UNITS; do echo "$UNITDIR/$unit"; done
        for hook in $HOOKS; do echo "$hook"; done
    } >"$DEST$VENV/share/modstage/installed"
}

install_config() {
    mkdir -p "$DEST/etc/modstage/trusted.d"
    if [ -e "$DEST/etc/modstage/config.toml" ]; then
        say "kept the existing /etc/modstage/config.toml"
    else
        cp "$SRC/deploy/config.example.toml" "$DEST/etc/modstage/config.toml"
        chmod 0644 "$DEST/etc/modstage/config.toml"
        say "wrote /etc/modstage/config.toml (an example: review it)"
    fi
}

systemd_running() { [ -z "$DEST" ] && [ -d /run/systemd/system ]; }

enable_units() {
    if ! command -v systemctl >/dev/null; then
        say "no systemctl: enable $UNITS yourself"
        return
    fi
    if systemd_running; then
        systemctl daemon-reload
        systemctl enable --quiet $UNITS
        if [ "$START" = yes ]; then systemctl restart modstage.service; fi
    else
        systemctl --root="${DEST:-/}" enable --quiet $UNITS
    fi
    say "enabled $UNITS"
}

do_install() {
    check_python
    build_venv
    install_files
    enable_units
    say "installed: $("$DEST$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("modstage"))' 2>/dev/null || echo modstage) in $VENV"
    [ -n "$(ls -A "$DEST/etc/modstage/trusted.d")" ] \
        || say "next: put the certificates that sign your modules in /etc/modstage/trusted.d"
}

# /var/lib/modstage (or incoming/ in it) may be a volume of its own: empty what cannot go.
purge() {
    for dir in "$@"; do
        rm -rf "$dir" 2>/dev/null || say "$dir: removed what could be (a mount point stays)"
    done
}

do_uninstall() {
    list=$DEST$VENV/share/modstage/installed
    [ -e "$list" ] || [ "$PURGE" = yes ] || die "nothing installed under ${DEST:-/}$VENV"
    if command -v systemctl >/dev/null; then
        if systemd_running; then
            systemctl disable --now --quiet $UNITS 2>/dev/null || true
        else
            systemctl --root="${DEST:-/}" disable --quiet $UNITS 2>/dev/null || true
        fi
    fi
    if [ -e "$list" ]; then
        while read -r path; do
            case "$path" in /*) rm -f "$DEST$path" ;; esac
        done <"$list"
    fi
    rm -rf "$DEST$VENV" "$DEST/opt/.modstage.new" "$DEST/opt/.modstage.old"
    if systemd_running; then systemctl daemon-reload; fi
    if [ "$PURGE" = yes ]; then
        purge "$DEST/etc/modstage" "$DEST/var/lib/modstage" "$DEST/run/modstage"
        rm -f "$DEST/var/lib/prometheus/node-exporter/modstage.prom"
        say "removed modstage, its configuration and its state"
    else
        say "removed modstage; kept /etc/modstage and /var/lib/modstage (--purge removes them)"
    fi
    say "modules already loaded stay loaded until the next boot"
}

parse "$@"
"do_$ACTION"
