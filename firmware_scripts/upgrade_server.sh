#!/bin/bash
# Upgrade a fedhar home server installed as the README says (README, "Upgrading"), as root:
#
#   sudo bash /opt/fedhar/firmware_scripts/upgrade_server.sh
#
# 1. stops fedhar-coordinator (Mosquitto keeps running; devices wait and reconnect by themselves);
# 2. copies the state the running release left, each folder under its own name, owners and modes kept:
#    <backup>/before-upgrade-<time>/{data,broker,etc,units} (the data folder, the broker folder server.toml names,
#    /etc/fedhar, and the installed fedhar unit files);
# 3. brings the code up to date (git pull --ff-only in the checkout, pip install -e '<prefix>[coordinator]');
# 4. installs this release's unit files over the old ones it finds (fedhar-coordinator.service, fedhar-backup.*),
#    lets the server's account pass into the broker folder (its settings and certificates: expiry on the page),
#    and reloads systemd;
# 5. starts fedhar-coordinator again and says what was done, and how to go back.
#
# Options (defaults are the README's paths): --prefix /opt/fedhar  --data /var/lib/fedhar  --etc /etc/fedhar
#   --units /etc/systemd/system  --backup /srv/backup/fedhar  --no-pull (the checkout is updated already)
#   --no-start (leave the server stopped)
# Stops at the first failure with its message; the backup is taken before anything changes.
# tests/test_upgrade_script.py runs it on the previous release's folders and unit files.
set -euo pipefail

main() {
    local prefix=/opt/fedhar data=/var/lib/fedhar etc=/etc/fedhar units=/etc/systemd/system backup=/srv/backup/fedhar
    local pull=yes start=yes
    while [ $# -gt 0 ]; do
        case "$1" in
            --prefix) prefix=$2; shift 2 ;;
            --data) data=$2; shift 2 ;;
            --etc) etc=$2; shift 2 ;;
            --units) units=$2; shift 2 ;;
            --backup) backup=$2; shift 2 ;;
            --no-pull) pull=no; shift ;;
            --no-start) start=no; shift ;;
            -h|--help) sed -n '2,20p' "$0"; return 0 ;;
            *) echo "upgrade_server.sh: unknown option $1 (--help lists them)" >&2; return 2 ;;
        esac
    done
    local venv=$prefix/.venv
    [ -x "$venv/bin/pip" ] || { echo "upgrade_server.sh: no venv in $venv: is fedhar installed in --prefix $prefix?" >&2; return 2; }
    [ -f "$data/server.sqlite" ] || { echo "upgrade_server.sh: $data/server.sqlite does not exist: name the data folder with --data" >&2; return 2; }
    local broker
    broker=$("$venv/bin/python" -c 'import sys, tomllib
try:
    print(tomllib.load(open(sys.argv[1], "rb")).get("server", {}).get("broker_dir") or "")
except FileNotFoundError:
    print("")' "$data/server.toml")

    echo "1. stopping fedhar-coordinator"
    systemctl stop fedhar-coordinator

    local stamp dest
    stamp=$(date +%Y%m%d-%H%M%S)
    dest=$backup/before-upgrade-$stamp
    echo "2. copying the current state into $dest"
    mkdir -p "$backup"
    mkdir -m 700 "$dest"
    cp -a "$data" "$dest/data"
    if [ -n "$broker" ] && [ -d "$broker" ]; then cp -a "$broker" "$dest/broker"; fi
    if [ -d "$etc" ]; then cp -a "$etc" "$dest/etc"; fi
    mkdir "$dest/units"
    local unit
    for unit in "$units"/fedhar-coordinator.service "$units"/fedhar-backup.service "$units"/fedhar-backup.timer; do
        if [ -f "$unit" ]; then cp -a "$unit" "$dest/units/"; fi
    done

    echo "3. updating the code in $prefix"
    if [ "$pull" = yes ]; then git -C "$prefix" pull --ff-only; fi
    "$venv/bin/pip" install --quiet -e "$prefix[coordinator]"

    echo "4. unit files and permissions"
    local new name
    for new in "$prefix"/firmware_scripts/systemd/fedhar-coordinator.service "$prefix"/firmware_scripts/systemd/fedhar-backup.service \
               "$prefix"/firmware_scripts/systemd/fedhar-backup.timer; do
        name=$(basename "$new")
        if [ -f "$units/$name" ] && ! cmp -s "$new" "$units/$name"; then
            install -m 644 "$new" "$units/$name"
            echo "   $units/$name replaced by this release's (the old one is in $dest/units)"
        fi
    done
    if [ -n "$broker" ] && [ -d "$broker" ]; then
        chmod o+x "$broker"
        if [ -d "$broker/tls" ]; then chmod o+x "$broker/tls"; fi
        echo "   $broker: the server's account may pass (it reads the broker's settings and certificates)"
    fi
    systemctl daemon-reload

    if [ "$start" = yes ]; then
        echo "5. starting fedhar-coordinator"
        systemctl start fedhar-coordinator
    fi
    echo "upgraded to $("$venv/bin/fedhar-coordinator" --version)"
    echo "the state before the upgrade is in $dest; to go back: stop the server, check out the old release, and copy"
    echo "$dest/data, broker, etc and units back over $data, ${broker:-the broker folder}, $etc and $units"
}

main "$@"; exit $?
