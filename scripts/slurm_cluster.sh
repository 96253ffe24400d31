#!/usr/bin/env bash
# A real single-node SLURM cluster with accounting, for the launcher tests (tests/test_slurm_*.py)
# and for trying the SLURM presets without a cluster. Debian 12 (SLURM 22.05), as root, no systemd.
#
#   bash scripts/slurm_cluster.sh install   # apt packages; no daemon is started by their postinst
#   bash scripts/slurm_cluster.sh start     # munged, mariadbd, slurmdbd, slurmctld, slurmd; waits until idle
#   bash scripts/slurm_cluster.sh status    # each daemon's pid, then sinfo
#   bash scripts/slurm_cluster.sh stop      # each daemon by its pid file, in reverse order
#   bash scripts/slurm_cluster.sh preempt-signal user|term   # what a preempted job gets (below)
#
# Partitions (all on the one node):
#   debug      the default; never preempted
#   preemptible  jobs here are preempted (SIGTERM, then requeued by SLURM) by a job on `urgent`
#   urgent     PriorityTier 10: its jobs preempt `preemptible` ones that hold what they need
# The node advertises 8 CPUs and one generic resource `slot` (--gres=slot:1): a test's preemptible
# job and its preemptor both ask for the slot, so the preemption hits that job alone while the
# other tests' jobs run on. SLURM sends SIGTERM on preemption (22.05's default, `preempt-signal
# term`), on scancel and on scontrol requeue; `preempt-signal user` turns on
# SlurmctldParameters=preempt_send_user_signal (cluster-wide; PreemptParameters=send_user_signal
# from 23.02): a preempted job gets its --signal (submitit's USR2) and SIGTERM at the same moment.
set -euo pipefail

ETC=/etc/slurm
STATE=/var/lib/horst-slurm            # controller/node state, logs, pid files, the database
RUN=$STATE/run
PACKAGES="munge slurmctld slurmd slurm-client slurmdbd mariadb-server-core mariadb-client-core"
NODE=$(hostname -s)
DAEMONS="munged mariadbd slurmdbd slurmctld slurmd"   # start order; stop is the reverse

die() { echo "slurm_cluster: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts daemons)"; }
# munged and mariadbd drop to their own users, so their pid files live in folders those users own.
pid_file() { case $1 in munged) echo /run/munge/munged.pid ;; mariadbd) echo /run/mysqld/mariadbd.pid ;; *) echo "$RUN/$1.pid" ;; esac; }
pid_of() { local f; f=$(pid_file "$1"); [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"; }

install() {
    need_root
    if command -v slurmctld >/dev/null && command -v mariadbd >/dev/null && command -v munged >/dev/null; then
        echo "slurm_cluster: packages already installed"; return
    fi
    # Package postinst scripts start their daemons; there is no init system to start them under.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null
}

write_config() {
    mkdir -p "$ETC" "$RUN" "$STATE"/{ctld,slurmd,log,mysql}
    getent hosts "$NODE" >/dev/null || echo "127.0.0.1 $NODE" >> /etc/hosts
    cat > "$ETC/slurm.conf" <<EOF
# Written by scripts/slurm_cluster.sh: a single-node test cluster.
ClusterName=horst
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# Job credentials expire after 10 s (default 120): a requeued job may start again that soon.
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
# No cgroups here (a container without systemd): track processes by parent pid, bind nothing.
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
# The main scheduler every 10 s (default 60): a requeued job restarts in ~12 s, not minutes.
SchedulerParameters=sched_interval=10
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without it a job that names no memory holds the whole node's.
DefMemPerCPU=500
# More CPUs and memory than this machine may have (config_overrides: not drained for it): the tests'
# jobs are tiny, single-threaded, and mostly wait.
SlurmdParameters=config_overrides
GresTypes=slot
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=16000 Gres=slot:1 State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF
PartitionName=preemptible Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10
# Without accounting sacct fails, and submitit waits forever on a cancelled job.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait=30
InactiveLimit=0
EOF
    echo "Name=slot Count=1" > "$ETC/gres.conf"
    cat > "$ETC/slurmdbd.conf" <<EOF
# Written by scripts/slurm_cluster.sh: accounting in MariaDB through its unix socket (no TCP; root by socket auth).
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$ETC/slurmdbd.conf"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local seconds=$1 what=$2; shift 2
    for _ in $(seq $((seconds * 10))); do "$@" >/dev/null 2>&1 && return; sleep 0.1; done
    die "$what did not come up in ${seconds} s; see $STATE/log/"
}

start() {
    need_root
    command -v slurmctld >/dev/null || die "SLURM is not installed; run: bash scripts/slurm_cluster.sh install"
    write_config
    if [ -z "$(pid_of munged)" ]; then
        mkdir -p /run/munge && chown munge:munge /run/munge
        [ -s /etc/munge/munge.key ] || { mungekey --create >/dev/null 2>&1 || create-munge-key; }
        chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
        runuser -u munge -- munged --pid-file="$(pid_file munged)"
        wait_for 10 munged pid_of munged
    fi
    if [ -z "$(pid_of mariadbd)" ]; then
        id mysql >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin mysql
        chown mysql:mysql "$STATE/mysql"
        mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
        [ -d "$STATE/mysql/mysql" ] || mariadb-install-db --user=mysql --datadir="$STATE/mysql" \
            --auth-root-authentication-method=socket > "$STATE/log/mariadb-install.log" 2>&1
        mariadbd --user=mysql --datadir="$STATE/mysql" --socket=/run/mysqld/mysqld.sock --skip-networking \
            --pid-file="$(pid_file mariadbd)" --log-error="$STATE/log/mariadb.log" >/dev/null 2>&1 &
        wait_for 30 mariadbd mariadb --socket=/run/mysqld/mysqld.sock -e "select 1"
    fi
    if [ -z "$(pid_of slurmdbd)" ]; then
        slurmdbd
        wait_for 30 slurmdbd sacctmgr -n list cluster
    fi
    sacctmgr -n list cluster format=cluster | grep -qw horst || sacctmgr -i add cluster horst >/dev/null
    [ -n "$(pid_of slurmctld)" ] || slurmctld
    wait_for 30 slurmctld scontrol ping
    [ -n "$(pid_of slurmd)" ] || slurmd
    wait_for 30 "the node" sh -c "sinfo -h -N -o %T | grep -qx idle"
    echo "slurm_cluster: up ($(sinfo -h -o '%P' | tr '\n' ' '))"
}

stop() {
    need_root
    for daemon in $(echo $DAEMONS | tr ' ' '\n' | tac); do
        local pid; pid=$(pid_of "$daemon") || continue
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        rm -f "$(pid_file "$daemon")"
    done
    echo "slurm_cluster: stopped"
}

preempt_signal() {  # user | term: the setting lives in slurm.conf; scontrol reconfigure applies it
    need_root
    case "${1:-}" in user|term) ;; *) die "usage: bash scripts/slurm_cluster.sh preempt-signal user|term" ;; esac
    sed -i '/^SlurmctldParameters=/d' "$ETC/slurm.conf"
    [ "$1" = user ] && echo "SlurmctldParameters=preempt_send_user_signal" >> "$ETC/slurm.conf"
    scontrol reconfigure
    wait_for 30 slurmctld scontrol ping
}

status() {
    local down=0
    for daemon in $DAEMONS; do
        if pid=$(pid_of "$daemon"); then echo "$daemon: running (pid $pid)"; else echo "$daemon: not running"; down=1; fi
    done
    [ "$down" = 0 ] && sinfo
    return $down
}

case "${1:-}" in
    install|start|stop|status) "$1" ;;
    preempt-signal) preempt_signal "${2:-}" ;;
    *) die "usage: bash scripts/slurm_cluster.sh install|start|stop|status|preempt-signal user|term" ;;
esac
