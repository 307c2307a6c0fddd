#!/bin/busybox sh
# /init of the kvcxl guest: load the CXL/DAX stack, create and commit a RAM region on
# the Type-3 device, hand it to device DAX, print `cxl list`, run the agent, power off.
# Every line the host parses starts with "@kvcxl " and carries one JSON object.
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null

ev() { echo "@kvcxl {\"event\":\"$1\",\"uptime\":$(cut -d' ' -f1 /proc/uptime)$2}"; }
fail() { ev fail ",\"reason\":\"$1\""; poweroff -f; }
arg() { sed -n "s/.*kvcxl\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
# wait_for PATH SECONDS: poll until PATH exists (probing is asynchronous).
wait_for() {
    n=0
    while [ ! -e "$1" ]; do
        n=$((n + 1)); [ $n -gt $(($2 * 20)) ] && return 1; sleep 0.05
    done
}
ev init
JOBS=$(arg jobs)
# How long a probing step may take, and the firmware may stay silent, before this guest
# calls it a failure: the host sets both for its machine (a loaded host is slow here).
PROBE_S=$(arg probe_s); [ -n "$PROBE_S" ] || PROBE_S=60
HEARTBEAT_MS=$(arg heartbeat_ms)

# Trace the CXL events (poison lists, media events) from before the driver probes.
T=/sys/kernel/tracing
[ -d $T/events/cxl ] && echo 1 > $T/events/cxl/enable

for m in $(cat /etc/kvcxl-modules); do
    insmod /lib/modules/$m.ko || fail "insmod $m"
done
ev modules

D=/sys/bus/cxl/devices
wait_for $D/mem0 $PROBE_S || fail "no memdev mem0 after ${PROBE_S} s"
wait_for $D/decoder0.0 $PROBE_S || fail "no root decoder decoder0.0 after ${PROBE_S} s"
n=0
until EP=$(ls -d $D/endpoint*/decoder*.0 2>/dev/null | head -1) && [ -n "$EP" ]; do
    n=$((n + 1)); [ $n -gt $((PROBE_S * 20)) ] && fail "no endpoint decoder after ${PROBE_S} s"; sleep 0.05
done
EP=$(basename $EP)
SIZE=$(cat $D/mem0/ram/size)
ev enumerated ",\"memdev\":\"mem0\",\"ram_size\":\"$SIZE\",\"endpoint_decoder\":\"$EP\""

# ndctl's `cxl create-region -t ram` is not supported yet: the sysfs sequence is.
R=$(cat $D/decoder0.0/create_ram_region)
echo $R > $D/decoder0.0/create_ram_region || fail "create_ram_region"
echo 1 > $D/$R/interleave_ways || fail "interleave_ways"
echo 4096 > $D/$R/interleave_granularity || fail "interleave_granularity"
echo ram > $D/$EP/mode || fail "decoder mode"
echo $SIZE > $D/$EP/dpa_size || fail "dpa_size"
echo $SIZE > $D/$R/size || fail "region size"
echo $EP > $D/$R/target0 || fail "target0"
echo 1 > $D/$R/commit || fail "commit"
echo $R > /sys/bus/cxl/drivers/cxl_region/bind 2>/dev/null
wait_for /sys/bus/dax/devices/dax0.0 $PROBE_S || fail "no dax0.0 after ${PROBE_S} s"
BASE=$(cat $D/$R/resource)
ev region ",\"region\":\"$R\",\"base\":\"$BASE\",\"size\":\"$(cat $D/$R/size)\",\"window_start\":\"$(cat $D/decoder0.0/start)\""

# The kernel onlined the region as system RAM (kmem): give it to device DAX instead.
daxctl reconfigure-device --mode=devdax --force dax0.0 > /tmp/dax.json 2>/tmp/dax.err \
    || fail "daxctl reconfigure: $(tr -d '\n"' < /tmp/dax.err)"
wait_for /dev/dax0.0 $PROBE_S || fail "no /dev/dax0.0 after ${PROBE_S} s"
ev region_ready ",\"dax\":\"/dev/dax0.0\""
echo "@kvcxl-begin cxl-list"
cxl list -M -R -H  # -H: the health the device reports (Get Health Info)
echo "@kvcxl-end cxl-list"

# The device's poison list, as the kernel traces it: "DPA:LEN," for the agent.
POISON=""
poison_list() {
    echo 1 > $D/mem0/trigger_poison_list 2>/dev/null
    sleep 0.2
    POISON=$(grep cxl_poison $T/trace | sed -n 's/.* dpa=\(0x[0-9a-f]*\) dpa_length=\(0x[0-9a-f]*\).*/\1:\2/p' | sort -u | tr '\n' ',')
    ev poison_list ",\"entries\":\"$POISON\""
}

for j in $(echo "$JOBS" | tr ',' ' '); do
    AGENT="/bin/kvcxl-agent --dax /dev/dax0.0 --base $BASE"
    [ -n "$POISON" ] && AGENT="$AGENT --poison $POISON"
    [ -n "$HEARTBEAT_MS" ] && AGENT="$AGENT --heartbeat-ms $HEARTBEAT_MS"
    case $j in
        poison) poison_list;;
        datapath) $AGENT datapath || ev agent_failed ",\"job\":\"datapath\"";;
        replay) $AGENT replay || ev agent_failed ",\"job\":\"replay\"";;
        malformed) $AGENT malformed || ev agent_failed ",\"job\":\"malformed\"";;
        fuzz) $AGENT fuzz || ev agent_failed ",\"job\":\"fuzz\"";;
        widths) $AGENT widths || ev agent_failed ",\"job\":\"widths\"";;
        widths_in_line) $AGENT widths_in_line || ev agent_failed ",\"job\":\"widths_in_line\"";;
        bench) $AGENT bench || ev agent_failed ",\"job\":\"bench\"";;
        wait) ev waiting; sleep "$(arg wait)";;
    esac
done

# CXL events the kernel traced (poison records, media events), one JSON line each.
if [ -r $T/trace ]; then
    grep -E 'cxl_(poison|general_media|dram|memory_module)' $T/trace | while read -r line; do
        echo "@kvcxl {\"event\":\"cxl_trace\",\"line\":\"$(echo "$line" | tr -d '"\\')\"}"
    done
fi
ev poweroff
poweroff -f
