#!/bin/sh
# Installs the one svc binary as PREFIX/bin/svc and makes every name a symlink to it.
#   install.sh [--prefix DIR] [--binary PATH] [--uninstall]
# Needs nothing but a POSIX shell and the usual file utilities.
set -eu

prefix=/usr
binary=
uninstall=0

usage() {
    cat <<'USAGE'
Usage: install.sh [--prefix DIR] [--binary PATH] [--uninstall]

Copies the svc binary to PREFIX/bin/svc and links every name (svc-server, svc-agent,
svcctl, svc-events, ...) to it. Without root, use a prefix you can write, e.g.
--prefix "$HOME/.local".

  --prefix DIR    install under DIR/bin (default /usr)
  --binary PATH   the binary to install (default: ./svc, else target/release/svc,
                  else target/debug/svc)
  --uninstall     remove PREFIX/bin/svc and every link to it
  -h, --help      show this help
USAGE
}

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a value" >&2; exit 2; }; prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        --binary) [ $# -ge 2 ] || { echo "install.sh: --binary needs a value" >&2; exit 2; }; binary=$2; shift 2 ;;
        --binary=*) binary=${1#--binary=}; shift ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

bindir="$prefix/bin"
here=$(cd "$(dirname "$0")" && pwd)
# What the release tarball ships beside install.sh (scripts/dist): completions and man pages.
bash_completion="$prefix/share/bash-completion/completions/svc"
zsh_completion="$prefix/share/zsh/site-functions/_svc"
fish_completion="$prefix/share/fish/vendor_completions.d/svc.fish"
mandir="$prefix/share/man"
# The names, should the binary not be there to ask (uninstall of a broken install).
fallback_names="svc-server svcctl svc-agent svc-audit svc-events svc-identity svc-secrets
svc-policy svc-cluster svc-cluster-backup svc-files svc-backup svc-blueprint svc-bootstrap
svc-gitops svc-migrate svc-module svc-registry svc-runbook svc-webhook"

names_of() {
    "$1" --list 2>/dev/null || echo "$fallback_names"
}

if [ "$uninstall" -eq 1 ]; then
    if [ -x "$bindir/svc" ]; then names=$(names_of "$bindir/svc"); else names=$fallback_names; fi
    for name in $names; do
        # Only remove links that point at our binary; never someone else's file.
        if [ -L "$bindir/$name" ] && [ "$(readlink "$bindir/$name")" = "svc" ]; then
            rm -f "$bindir/$name"
        fi
    done
    for name in $names; do
        link="$(dirname "$bash_completion")/$name"
        if [ -L "$link" ] && [ "$(readlink "$link")" = "svc" ]; then rm -f "$link"; fi
        link="$(dirname "$fish_completion")/$name.fish"
        if [ -L "$link" ] && [ "$(readlink "$link")" = "svc.fish" ]; then rm -f "$link"; fi
    done
    rm -f "$bindir/svc"
    rm -f "$bash_completion" "$zsh_completion" "$fish_completion" "$mandir"/man1/svc.1 \
        "$mandir"/man1/svcctl.1 "$mandir"/man1/svc-*.1 "$mandir"/man8/svc-*.8
    echo "removed svc from $bindir"
    exit 0
fi

if [ -z "$binary" ]; then
    for candidate in "$here/svc" "$here/target/release/svc" "$here/target/debug/svc"; do
        if [ -f "$candidate" ] && [ -x "$candidate" ]; then binary=$candidate; break; fi
    done
fi
if [ -z "$binary" ] || [ ! -x "$binary" ]; then
    echo "install.sh: no svc binary found; build it (cargo build --release) or pass --binary PATH" >&2
    exit 1
fi

mkdir -p "$bindir"
# Copy to a temporary name and rename, so a running svc is never half-overwritten.
cp "$binary" "$bindir/.svc.new.$$"
chmod 0755 "$bindir/.svc.new.$$"
mv -f "$bindir/.svc.new.$$" "$bindir/svc"
for name in $(names_of "$bindir/svc"); do
    ln -sf svc "$bindir/$name"
done
if [ -d "$here/completions" ]; then
    for pair in "svc.bash:$bash_completion" "_svc:$zsh_completion" "svc.fish:$fish_completion"; do
        mkdir -p "$(dirname "${pair#*:}")"
        cp "$here/completions/${pair%%:*}" "${pair#*:}"
    done
    # bash-completion loads completions/NAME and fish vendor_completions.d/NAME.fish when NAME
    # is first completed: one link per name.
    for name in $(names_of "$bindir/svc"); do
        ln -sf svc "$(dirname "$bash_completion")/$name"
        ln -sf svc.fish "$(dirname "$fish_completion")/$name.fish"
    done
fi
if [ -d "$here/man" ]; then
    for page in "$here"/man/*.[18]; do
        section=${page##*.}
        mkdir -p "$mandir/man$section"
        cp "$page" "$mandir/man$section/"
    done
fi
echo "installed $bindir/svc and $(names_of "$bindir/svc" | wc -w | tr -d ' ') names"
