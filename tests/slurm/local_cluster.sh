#!/usr/bin/env bash
# A real single-node SLURM cluster (munge, MariaDB, slurmdbd, slurmctld, slurmd) from Debian packages, for tests.
#   local_cluster.sh install          apt-get the packages if missing (root only)
#   local_cluster.sh start DIR        start the daemons with state in DIR; prints `export SLURM_CONF=...`
#   local_cluster.sh stop DIR         kill each daemon by the PID in its pid file
# No systemd here: every daemon is started by hand and stopped by PID. slurmdbd makes `sacct` work, without
# which submitit hangs on a job that SLURM killed.
set -euo pipefail
# The last error line of the daemons' logs, so that a failed start names the daemon's own error.
daemon_error() {
  local f line=""
  for f in "${B:-/nonexistent}"/log/*.log; do
    [ -f "$f" ] || continue
    line=$(grep -iE 'error|fatal|fail|unable|cannot' "$f" | tail -n 1) || true
    [ -n "$line" ] && { echo "$(basename "$f"): $line"; return; }
  done
  echo "no error line in ${B:-?}/log"
}
trap 'echo "local_cluster.sh: line $LINENO failed: $BASH_COMMAND ($(daemon_error))" >&2' ERR
# wait_for SECONDS WHAT CMD...: poll CMD until it succeeds; past the deadline fail with the daemon's error line
# (a daemon that cannot start must not leave its caller waiting for the caller's own timeout).
wait_for() {
  local secs=$1 what=$2
  shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$end" ]; then
      trap - ERR
      echo "local_cluster.sh: $what did not start within ${secs} s: $(daemon_error)" >&2
      exit 1
    fi
    sleep 0.2
  done
}
cmd=${1:?install|start|stop}

if [ "$cmd" = install ]; then
  need=()
  command -v slurmctld >/dev/null || need+=(slurm-wlm)
  command -v munged >/dev/null || need+=(munge)
  command -v slurmdbd >/dev/null || need+=(slurmdbd)
  command -v mariadbd >/dev/null || need+=(mariadb-server)
  if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "need root to install ${need[*]}" >&2; exit 3; }
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  exit 0
fi

B=$(realpath -m "${2:?state dir}")
if [ "$cmd" = stop ]; then
  if [ -f "$B/slurm.conf" ]; then   # no job may outlive the cluster
    export SLURM_CONF="$B/slurm.conf"
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 100); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
  fi
  # two waves, each stopped together (one after another took ~8 s): the SLURM daemons, then the database and munge
  stop_wave() {
    local pids=() f pid
    for f in "$@"; do [ -f "$f" ] && pids+=("$(cat "$f")"); done
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for _ in $(seq 100); do   # wait up to 10 s for the whole wave
      local alive=0
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [ "$alive" = 0 ] && break
      sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    rm -f "$@"
  }
  stop_wave "$B"/run/slurmd.pid "$B"/run/slurmctld.pid "$B"/run/slurmdbd.pid
  stop_wave "$B"/run/mariadbd.pid /run/mysqld/mariadbd-suite.pid /run/munge/munged-suite.pid
  exit 0
fi

mkdir -p "$B"/{state,spool,log,run}
install -d -o munge -g munge -m 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged-suite.pid
  wait_for 30 munged bash -c 'munge -n | unmunge'
fi
install -d -o mysql -g mysql "$B/mysql" /run/mysqld
[ -d "$B/mysql/mysql" ] || mariadb-install-db --user=mysql --datadir="$B/mysql" >"$B/log/mariadb-install.log" 2>&1
SOCK=/run/mysqld/mysqld-suite.sock
# Its PID recorded at once (mariadbd writes its own pid file only once it is up), so `stop` ends it even when it
# never came up.
mariadbd --user=mysql --datadir="$B/mysql" --socket=$SOCK --skip-networking=0 --bind-address=127.0.0.1 --port=3306 \
   --pid-file=/run/mysqld/mariadbd-suite.pid >"$B/log/mariadb.log" 2>&1 </dev/null &
echo $! >"$B/run/mariadbd.pid"
wait_for 60 mariadbd mariadb -uroot -S $SOCK -e 'select 1'
mariadb -uroot -S $SOCK -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmtest'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
cat >"$B/slurmdbd.conf" <<EOC
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=$B/log/slurmdbd.log
PidFile=$B/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=slurmtest
EOC
chmod 600 "$B/slurmdbd.conf"
cat >"$B/slurm.conf" <<EOC
ClusterName=suite
SlurmctldHost=localhost
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$B/state
SlurmdSpoolDir=$B/spool
SlurmctldPidFile=$B/run/slurmctld.pid
SlurmdPidFile=$B/run/slurmd.pid
SlurmctldLogFile=$B/log/slurmctld.log
SlurmdLogFile=$B/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobRequeue=1
# A requeued job waits cred_expire seconds before it may start again (default 120: most of the requeue test).
AuthInfo=cred_expire=10
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=300
NodeName=localhost CPUs=$(nproc) RealMemory=16000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOC
export SLURM_CONF="$B/slurm.conf"
slurmdbd
wait_for 60 slurmdbd sacctmgr -n list cluster
sacctmgr -i add cluster suite >/dev/null 2>&1 || true
slurmctld -i
slurmd -N localhost
wait_for 60 "slurmctld/slurmd" bash -c 'sinfo -h -o %T | grep -qx idle'
echo "export SLURM_CONF=$B/slurm.conf"
