#!/usr/bin/env bash
# Set up a Raspberry Pi (64-bit Raspberry Pi OS bookworm, or Debian 12 arm64) as a fedhar edge client.
#
#   sudo firmware_scripts/pi_setup.sh --client-id pi-kitchen --broker homeserver:8883 --federation home \
#        --password-file pi-kitchen.password [--tls-ca ca.crt] [--source recorded:hapt6] \
#        [--backend numpy|torch] [--threads N] [--wheelhouse DIR] [--no-i2c] [--dry-run]
#   sudo firmware_scripts/pi_setup.sh --enrolment pi-kitchen.json [--source ...] [--backend ...] [--dry-run]
#   sudo firmware_scripts/pi_setup.sh --client-id pi-kitchen --uninstall [--purge]
#
# Steps: enable I2C where Raspberry Pi OS's tools are present (skipped with a message where not),
# install the missing system packages, create the service account (group i2c), copy this checkout
# to /opt/fedhar, create its venv with the training backend (numpy: fedhar[pi]; torch: PyTorch's
# CPU build, then fedhar[pi,client]), write /etc/fedhar/client-<id>.env (with --backend) and the
# password file, install, enable and (re)start the unit fedhar-client@<id>. Running it again
# converges to the same state. --wheelhouse installs offline from a folder of wheels
# (firmware_scripts/pi_emulated/wheelhouse.sh makes one). --uninstall removes what it installed;
# the device's recorded windows and model in /var/lib/fedhar/<id> stay unless --purge.
# --dry-run prints the commands instead. --enrolment takes the client id, broker, federation, password
# and CA from a bundle (fedhar-coordinator enrol NAME writes it), checked first: a refused bundle
# stops setup with the reason, before anything is installed. Guide: docs/devices.md, "Raspberry Pi".
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
prefix=/opt/fedhar
etc=/etc/fedhar
unit_dir=/etc/systemd/system
torch_version=2.13.0
torch_index=https://download.pytorch.org/whl/cpu
client_id="" broker="" federation="home" password_file="" tls_ca="" source="recorded:hapt6" dry=0 i2c=1
backend=numpy threads="" wheelhouse="" uninstall=0 purge=0 enrolment="" federation_set=0

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --client-id) client_id="$2"; shift 2 ;;
    --broker) broker="$2"; shift 2 ;;
    --federation) federation="$2"; federation_set=1; shift 2 ;;
    --enrolment) enrolment="$2"; shift 2 ;;
    --password-file) password_file="$2"; shift 2 ;;
    --tls-ca) tls_ca="$2"; shift 2 ;;
    --source) source="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --wheelhouse) wheelhouse="$2"; shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    --no-i2c) i2c=0; shift ;;
    --uninstall) uninstall=1; shift ;;
    --purge) purge=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "pi_setup.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
# An enrolment bundle gives the client id, broker, federation, password and CA. It is checked here, with the
# system's Python (standard library only) and this checkout's har_io/enrolment.py, before anything changes.
bundle_tls=""
if [ -n "$enrolment" ]; then
  if [ -n "$password_file" ]; then
    echo "pi_setup.sh: --password-file and --enrolment: the password comes from the bundle; drop --password-file" >&2; exit 2
  fi
  check=(--prog pi_setup.sh --shell)
  [ "$federation_set" -eq 1 ] && check+=(--federation "$federation")
  [ -n "$tls_ca" ] && check+=(--tls-ca "$tls_ca")
  if ! fields="$(PYTHONPATH="$repo" python3 -m har_io.enrolment "$enrolment" "${check[@]}")"; then
    echo "pi_setup.sh: setup stopped: the enrolment bundle $enrolment was refused (nothing was installed)" >&2; exit 2
  fi
  eval "$(printf '%s\n' "$fields" | sed 's/^/bundle_/')"  # bundle_client_id, bundle_broker, ... (values shell-quoted)
  if [ -n "$client_id" ] && [ "$client_id" != "$bundle_client_id" ]; then
    echo "pi_setup.sh: --client-id $client_id contradicts the bundle's client id $bundle_client_id: drop --client-id" >&2; exit 2
  fi
  if [ -n "$broker" ] && [ "$broker" != "$bundle_broker" ]; then
    echo "pi_setup.sh: --broker $broker contradicts the bundle's broker $bundle_broker: drop --broker" >&2; exit 2
  fi
  if [ "$bundle_tls" = fingerprint ] && [ -z "$tls_ca" ]; then
    echo "pi_setup.sh: the bundle names the broker's CA by its SHA-256 $bundle_ca_sha256 only: give --tls-ca with that CA's certificate" >&2
    exit 2
  fi
  client_id="$bundle_client_id" broker="$bundle_broker" federation="$bundle_federation"
  echo "pi_setup.sh: enrolment bundle $enrolment: client $client_id of federation $federation (coordinator $bundle_coordinator), broker $broker"
fi
if ! [[ "$client_id" =~ ^[A-Za-z0-9_.-]{1,64}$ ]]; then
  echo "pi_setup.sh: --client-id must be 1-64 letters, digits, _ . - (got '${client_id}')" >&2; exit 2
fi
if [ "$dry" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
  echo "pi_setup.sh: run it as root (sudo), or with --dry-run to see the steps" >&2; exit 2
fi

run() { if [ "$dry" -eq 1 ]; then echo "+ $*"; else "$@"; fi; }
note() { echo "pi_setup.sh: $*"; }
write() {  # write FILE MODE: stdin to FILE
  if [ "$dry" -eq 1 ]; then echo "+ write $1 (mode $2):"; sed 's/^/    /'; else install -m "$2" /dev/stdin "$1"; fi
}
have_systemd() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; }

if [ "$uninstall" -eq 1 ]; then
  if have_systemd || [ "$dry" -eq 1 ]; then
    run systemctl disable --now "fedhar-client@$client_id" || true
    run systemctl reset-failed "fedhar-client@$client_id" || true
  fi
  run rm -f "$etc/client-$client_id.env" "$etc/$client_id.password" "$etc/$client_id.ca.crt"
  if [ "$purge" -eq 1 ]; then
    run rm -rf "/var/lib/fedhar/$client_id"
  else
    note "kept the recorded windows and the local model in /var/lib/fedhar/$client_id (--purge removes them)"
  fi
  # The shared parts go with the last client on this machine.
  others="$(find "$etc" -maxdepth 1 -name 'client-*.env' 2>/dev/null | grep -vx "$etc/client-$client_id.env" || true)"
  if [ -z "$others" ]; then
    run rm -f "$unit_dir/fedhar-client@.service" /etc/modules-load.d/fedhar-i2c.conf "$etc/ca.crt"
    if have_systemd || [ "$dry" -eq 1 ]; then run systemctl daemon-reload; fi
    if [ "$repo" != "$prefix" ]; then run rm -rf "$prefix"; else note "kept $prefix: this script runs from it"; fi
    if [ ! -e "$unit_dir/fedhar-coordinator.service" ] && id fedhar >/dev/null 2>&1; then run userdel fedhar; fi
    if [ -d "$etc" ]; then run rmdir --ignore-fail-on-non-empty "$etc"; fi
    [ "$purge" -eq 1 ] && run rm -rf /var/cache/fedhar
    note "the dtparam=i2c_arm=on line in the boot configuration stays (I2C may serve other devices)"
  else
    note "other clients remain on this machine ($(echo "$others" | wc -l)): kept $prefix and the unit template"
  fi
  note "uninstalled fedhar-client@$client_id"
  exit 0
fi

if ! [[ "$broker" =~ ^[^:[:space:]]+:[0-9]+$ ]]; then
  echo "pi_setup.sh: --broker must be HOST:PORT, e.g. homeserver:8883 (got '${broker}')" >&2; exit 2
fi
case "$backend" in
  numpy) extras=pi; [ -z "$threads" ] || { echo "pi_setup.sh: --threads sets PyTorch's threads: use it with --backend torch" >&2; exit 2; } ;;
  torch) extras=pi,client; threads="${threads:-2}" ;;
  *) echo "pi_setup.sh: --backend must be numpy (no PyTorch, the default) or torch (got '$backend')" >&2; exit 2 ;;
esac
if [ -n "$threads" ] && ! [[ "$threads" =~ ^[1-9][0-9]*$ ]]; then
  echo "pi_setup.sh: --threads must be a positive whole number (got '$threads')" >&2; exit 2
fi
if [ -n "$password_file" ] && [ "$dry" -eq 0 ] && [ ! -r "$password_file" ]; then
  echo "pi_setup.sh: cannot read --password-file $password_file" >&2; exit 2
fi
if [ -n "$wheelhouse" ] && [ ! -d "$wheelhouse" ]; then
  echo "pi_setup.sh: --wheelhouse $wheelhouse is not a folder (make one with firmware_scripts/pi_emulated/wheelhouse.sh)" >&2; exit 2
fi
machine="$(uname -m)"
case "$machine" in
  aarch64|x86_64) ;;
  *)
    if [ "$backend" = torch ]; then
      echo "pi_setup.sh: PyTorch has no wheel for $machine (a 32-bit OS): install 64-bit Raspberry Pi OS, or use --backend numpy" >&2
      exit 2
    fi
    note "$machine is a 32-bit OS: only the numpy backend can run, and it was verified on 64-bit (aarch64) only"
    ;;
esac

# 1. I2C: the kernel driver at boot and now; /dev/i2c-1 belongs to group i2c. Only Raspberry Pi OS has
#    raspi-config and the firmware's config.txt; elsewhere each missing piece is skipped and named.
if [ "$i2c" -eq 1 ]; then
  if command -v raspi-config >/dev/null 2>&1; then
    run raspi-config nonint do_i2c 0
  else
    note "raspi-config not found (not Raspberry Pi OS): enabling I2C by hand"
    cfg=/boot/firmware/config.txt; [ -f "$cfg" ] || cfg=/boot/config.txt
    if [ -f "$cfg" ]; then
      grep -q '^dtparam=i2c_arm=on' "$cfg" || run sh -c "echo dtparam=i2c_arm=on >> $cfg"
    else
      note "no /boot/firmware/config.txt or /boot/config.txt: skipped dtparam=i2c_arm=on (enable I2C in this board's firmware)"
    fi
    echo i2c-dev | write /etc/modules-load.d/fedhar-i2c.conf 644
    if [ "$dry" -eq 0 ] && ! modprobe i2c-dev 2>/dev/null; then
      note "modprobe i2c-dev failed (no such kernel module here): /dev/i2c-1 will not exist until the board's kernel has it"
    fi
  fi
fi

# 2. System packages, only those missing (an offline board with them all needs no archive).
need=()
for pkg in python3-venv i2c-tools rsync; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  run apt-get update -qq
  run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

# 3. The service account, allowed on the I2C bus.
run groupadd -f i2c
if ! id fedhar >/dev/null 2>&1; then
  run useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin fedhar
fi
run usermod -aG i2c fedhar

# 4. The code and its venv with a training backend. PyTorch's CPU build comes from its own index
#    (PyPI's torch pulls the CUDA libraries, about 2.9 GB on aarch64); fedhar[pi] brings smbus2.
if [ "$repo" != "$prefix" ]; then
  run rsync -a --delete --exclude .venv --exclude .git --exclude build --exclude runs "$repo/" "$prefix/"
fi
[ -x "$prefix/.venv/bin/python" ] || run python3 -m venv "$prefix/.venv"
pip_src=()
[ -n "$wheelhouse" ] && pip_src=(--no-index --find-links "$wheelhouse")
if [ "$backend" = torch ]; then
  if [ -n "$wheelhouse" ]; then
    run "$prefix/.venv/bin/pip" install -q "${pip_src[@]}" "torch==$torch_version"
  else
    run "$prefix/.venv/bin/pip" install -q "torch==$torch_version" --index-url "$torch_index"
  fi
fi
run "$prefix/.venv/bin/pip" install -q "${pip_src[@]}" -e "$prefix[$extras]"
# The installed program itself, with the chosen backend's imports: a missing module fails here, not in the unit.
# Only what the chosen backend needs is checked (numpy: numpy, paho-mqtt, smbus2; torch adds PyTorch), each missing
# module named with its use (edge_client/install_check.py).
if ! run "$prefix/.venv/bin/python" -m edge_client.install_check --backend "$backend" --prog pi_setup.sh; then
  echo "pi_setup.sh: setup stopped: the venv $prefix/.venv lacks what the $backend backend needs (named above); the unit was not installed" >&2
  exit 7
fi
run "$prefix/.venv/bin/fedhar-client" --help >/dev/null

# 5. The client's configuration.
run install -d -m 755 "$etc"
tls_arg=""
if [ "$bundle_tls" = inline ]; then  # the bundle's own CA and password, written by its checker (atomically)
  run "$prefix/.venv/bin/python" -m har_io.enrolment "$enrolment" --prog pi_setup.sh \
    --write-password "$etc/$client_id.password" --write-ca "$etc/$client_id.ca.crt"
  tls_arg="--tls-ca $etc/$client_id.ca.crt "
elif [ -n "$enrolment" ]; then
  run "$prefix/.venv/bin/python" -m har_io.enrolment "$enrolment" --prog pi_setup.sh --write-password "$etc/$client_id.password"
fi
if [ -n "$tls_ca" ]; then
  run install -m 644 "$tls_ca" "$etc/ca.crt"
  tls_arg="--tls-ca $etc/ca.crt "
fi
if [ -n "$password_file" ]; then
  run install -m 600 "$password_file" "$etc/$client_id.password"
fi
[ -n "$enrolment" ] && note "$enrolment holds the device's password: delete it once the client has joined (journalctl -u fedhar-client@$client_id)"
client_args="${tls_arg}--backend $backend"
[ -n "$threads" ] && client_args="$client_args --threads $threads"
write "$etc/client-$client_id.env" 644 <<ENV
# Written by pi_setup.sh for fedhar-client@$client_id.service (see client.env.example).
FEDHAR_BROKER=$broker
FEDHAR_FEDERATION=$federation
# recorded:<label set> = the windows recorded on this Pi with fedhar-record (or fedhar-app).
FEDHAR_SOURCE=$source
FEDHAR_CLIENT_ARGS=$client_args
ENV

# 6. The systemd unit (firmware_scripts/systemd), enabled, and (re)started on the configuration above.
run install -m 644 "$here/systemd/fedhar-client@.service" "$unit_dir/fedhar-client@.service"
if have_systemd || [ "$dry" -eq 1 ]; then
  run systemctl daemon-reload
  run systemctl enable "fedhar-client@$client_id"
  if [ -e "$etc/$client_id.password" ] || [ -n "$password_file" ] || [ -n "$enrolment" ]; then
    run systemctl restart "fedhar-client@$client_id"
  else
    note "no --password-file: copy the broker's credentials/$client_id.password to $etc/$client_id.password (mode 600), then: systemctl start fedhar-client@$client_id"
  fi
else
  note "systemd is not running here: installed the unit, start it after booting with systemd"
fi

cat <<EOF2

Done. Check the IMU:   i2cdetect -y 1        (an MPU-6050 shows up at 68, or 69 with AD0 high)
Record an activity:    sudo -u fedhar $prefix/.venv/bin/fedhar-record --state-dir /var/lib/fedhar/$client_id --activity walking --seconds 120
Then let the client train on it:  sudo systemctl restart fedhar-client@$client_id
Logs:                  journalctl -u fedhar-client@$client_id -f
EOF2
if [ "$i2c" -eq 1 ] && [ "$dry" -eq 0 ] && [ ! -e /dev/i2c-1 ]; then
  echo "/dev/i2c-1 appears after a reboot: sudo reboot"
fi
