#!/usr/bin/env bash
# Set up a Raspberry Pi as a fedhar edge client with an MPU-6050 on I2C.
#
#   sudo firmware_scripts/pi_setup.sh --client-id pi-kitchen --broker homeserver:8883 --federation home \
#        --password-file pi-kitchen.password [--tls-ca ca.crt] [--source recorded:hapt6] [--dry-run]
#
# Steps: enable I2C, install system packages, create the service account (group i2c), copy
# this checkout to /opt/fedhar, create its virtual environment with the client's extra
# (fedhar[pi]: smbus2), write /etc/fedhar/client-<id>.env and the password file, install
# and enable the systemd unit fedhar-client@<id>. --dry-run prints the commands instead.
# Guide: docs/devices.md, "Raspberry Pi".
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
prefix=/opt/fedhar
etc=/etc/fedhar
client_id="" broker="" federation="home" password_file="" tls_ca="" source="recorded:hapt6" dry=0 i2c=1 threads=2

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --client-id) client_id="$2"; shift 2 ;;
    --broker) broker="$2"; shift 2 ;;
    --federation) federation="$2"; shift 2 ;;
    --password-file) password_file="$2"; shift 2 ;;
    --tls-ca) tls_ca="$2"; shift 2 ;;
    --source) source="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    --no-i2c) i2c=0; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "pi_setup.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if ! [[ "$client_id" =~ ^[A-Za-z0-9_.-]{1,64}$ ]]; then
  echo "pi_setup.sh: --client-id must be 1-64 letters, digits, _ . - (got '${client_id}')" >&2; exit 2
fi
if ! [[ "$broker" =~ ^[^:[:space:]]+:[0-9]+$ ]]; then
  echo "pi_setup.sh: --broker must be HOST:PORT, e.g. homeserver:8883 (got '${broker}')" >&2; exit 2
fi
if [ -n "$password_file" ] && [ "$dry" -eq 0 ] && [ ! -r "$password_file" ]; then
  echo "pi_setup.sh: cannot read --password-file $password_file" >&2; exit 2
fi
if [ "$dry" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
  echo "pi_setup.sh: run it as root (sudo), or with --dry-run to see the steps" >&2; exit 2
fi

run() { if [ "$dry" -eq 1 ]; then echo "+ $*"; else "$@"; fi; }
write() {  # write FILE MODE: stdin to FILE
  if [ "$dry" -eq 1 ]; then echo "+ write $1 (mode $2):"; sed 's/^/    /'; else install -m "$2" /dev/stdin "$1"; fi
}

# 1. I2C: the kernel driver at boot and now; /dev/i2c-1 belongs to group i2c.
if [ "$i2c" -eq 1 ]; then
  if command -v raspi-config >/dev/null 2>&1 || [ "$dry" -eq 1 ]; then
    run raspi-config nonint do_i2c 0
  else
    cfg=/boot/firmware/config.txt; [ -f "$cfg" ] || cfg=/boot/config.txt
    grep -q '^dtparam=i2c_arm=on' "$cfg" || echo 'dtparam=i2c_arm=on' >> "$cfg"
    echo i2c-dev > /etc/modules-load.d/fedhar-i2c.conf
    modprobe i2c-dev || true
  fi
fi

# 2. System packages.
run apt-get update -qq
run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-dev i2c-tools rsync

# 3. The service account, allowed on the I2C bus.
run groupadd -f i2c
if ! id fedhar >/dev/null 2>&1; then
  run useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin fedhar
fi
run usermod -aG i2c fedhar

# 4. The code and its virtual environment (the client extra brings smbus2).
if [ "$repo" != "$prefix" ]; then
  run rsync -a --delete --exclude .venv --exclude .git --exclude build --exclude runs "$repo/" "$prefix/"
fi
run python3 -m venv "$prefix/.venv"
run "$prefix/.venv/bin/pip" install -q -e "$prefix[pi]"

# 5. The client's configuration.
run install -d -m 755 "$etc"
tls_arg=""
if [ -n "$tls_ca" ]; then
  run install -m 644 "$tls_ca" "$etc/ca.crt"
  tls_arg="--tls-ca $etc/ca.crt "
fi
if [ -n "$password_file" ]; then
  run install -m 600 "$password_file" "$etc/$client_id.password"
else
  echo "(no --password-file: copy the broker's credentials/$client_id.password to $etc/$client_id.password before starting)"
fi
write "$etc/client-$client_id.env" 644 <<ENV
# Written by pi_setup.sh for fedhar-client@$client_id.service (see client.env.example).
FEDHAR_BROKER=$broker
FEDHAR_FEDERATION=$federation
# recorded:<label set> = the windows recorded on this Pi with fedhar-record (or fedhar-app).
FEDHAR_SOURCE=$source
FEDHAR_CLIENT_ARGS=${tls_arg}--threads $threads
ENV

# 6. The systemd unit (firmware_scripts/systemd), enabled and started.
run install -m 644 "$here/systemd/fedhar-client@.service" /etc/systemd/system/fedhar-client@.service
run systemctl daemon-reload
run systemctl enable --now "fedhar-client@$client_id"

cat <<EOF2

Done. Check the IMU:   i2cdetect -y 1        (an MPU-6050 shows up at 68, or 69 with AD0 high)
Record an activity:    sudo -u fedhar $prefix/.venv/bin/fedhar-record --state-dir /var/lib/fedhar/$client_id --activity walking --seconds 120
Then let the client train on it:  sudo systemctl restart fedhar-client@$client_id
Logs:                  journalctl -u fedhar-client@$client_id -f
EOF2
if [ "$i2c" -eq 1 ] && [ "$dry" -eq 0 ] && [ ! -e /dev/i2c-1 ]; then
  echo "/dev/i2c-1 appears after a reboot: sudo reboot"
fi
