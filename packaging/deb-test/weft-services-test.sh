#!/bin/bash
# Runs inside the clean Debian of `cargo xtask deb-test`, booted with systemd as PID 1
# (systemd-nspawn -b), as the unit weft-services-test.service: the package's two services
# started with systemctl as an administrator would, the controller answering /healthz and
# the API, the agent enrolled with a one-time token and reporting, both logging at INFO,
# then both stopped. The verdict goes to /weft-services-test.result (PASS or FAIL: why),
# the log of every step to /weft-services-test.log; the host reads both.
set -uo pipefail
exec >/weft-services-test.log 2>&1
set -x

fail() {
    set +x
    echo "FAIL: $*"
    systemctl --no-pager status weft-controller weft-agent
    journalctl --no-pager -u weft-controller -u weft-agent | tail -n 60
    echo "FAIL: $*" >/weft-services-test.result
    exit 1
}

# wait_for SECONDS WHAT COMMAND...: COMMAND until it succeeds, bounded.
wait_for() {
    local limit=$1 what=$2
    shift 2
    for _ in $(seq $((limit * 5))); do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.2
    done
    fail "$what (waited ${limit} s)"
}

# GET /healthz over bash's /dev/tcp (the minimal system has no HTTP client).
healthz() {
    exec 3<>/dev/tcp/127.0.0.1/7100 || return 1
    printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
    local answer
    answer=$(cat <&3)
    exec 3<&-
    [[ $answer == "HTTP/1.0 200"* || $answer == "HTTP/1.1 200"* ]] && [[ $answer == *$'\n'ok* ]]
}

[ "$(cat /proc/1/comm)" = systemd ] || fail "PID 1 is $(cat /proc/1/comm), not systemd"
systemctl cat weft-controller.service weft-agent.service >/dev/null ||
    fail "the package's units are not known to systemd"

token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
install -d -m 0755 /etc/weft
install -m 0600 /dev/null /etc/weft/controller.env
printf 'WEFT_ADMIN_TOKEN=%s\n' "$token" >/etc/weft/controller.env
# This machine has no subnet manager: the controller records changes instead of delivering
# them (a drop-in, as an administrator would write one).
install -d /etc/systemd/system/weft-controller.service.d
cat >/etc/systemd/system/weft-controller.service.d/no-fabric.conf <<'UNIT'
[Service]
ExecStart=
ExecStart=/usr/bin/weft --config /etc/weft/weft.toml controller --db /var/lib/weft/controller.db --init --no-fabric
UNIT
systemctl daemon-reload

systemctl start weft-controller || fail "systemctl start weft-controller"
wait_for 30 "the controller answers GET /healthz" healthz
export WEFT_CONTROLLER=http://127.0.0.1:7100 WEFT_TOKEN=$token
weft nodes >/dev/null || fail "the controller's API refuses the admin token"
host=$(hostname)
enroll=$(weft nodes enroll --server "$host") || fail "weft nodes enroll --server $host"
install -m 0600 /dev/null /etc/weft/agent.env
printf 'WEFT_CONTROLLER=http://127.0.0.1:7100\nWEFT_ENROLL_TOKEN=%s\n' "$enroll" >/etc/weft/agent.env

systemctl start weft-agent || fail "systemctl start weft-agent"
reporting() { weft --json nodes | tr -d ' \n' | grep -q "\"name\":\"$host\",\"liveness\":\"ok\""; }
wait_for 30 "the agent enrolled as $host and reported (liveness ok)" reporting
[ -s /var/lib/weft-agent/agent.json ] ||
    fail "the agent kept no credentials in its StateDirectory"
logged() { journalctl --no-pager -u weft-agent | grep -q ' INFO '; }
wait_for 10 "the agent logged at INFO" logged
logged_ctl() { journalctl --no-pager -u weft-controller | grep -q ' INFO '; }
wait_for 10 "the controller logged at INFO" logged_ctl
for unit in weft-controller weft-agent; do
    [ "$(systemctl is-active "$unit")" = active ] || fail "$unit is not active"
    [ "$(systemctl show -P NRestarts "$unit")" = 0 ] || fail "$unit restarted"
done
user=$(systemctl show -P MainPID weft-agent | xargs -I{} stat -c %U /proc/{})
[ "$user" != root ] || fail "the agent runs as root, not as its dynamic user"

systemctl stop weft-agent weft-controller || fail "systemctl stop"
for unit in weft-controller weft-agent; do
    state=$(systemctl is-active "$unit")
    [ "$state" = inactive ] || fail "$unit is $state after stop, not inactive"
done
set +x
journalctl --no-pager -u weft-controller -u weft-agent | tail -n 20
echo PASS >/weft-services-test.result
echo PASS
