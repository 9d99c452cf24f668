#!/usr/bin/env bash
# RocketMQ's mqadmin for the local test cluster: MQAdminStartup from the jars in
# .services/rocketmq/lib, against the name server in DELAYBRIDGE_ROCKETMQ_NAMESRV
# (default 127.0.0.1:9876), which is passed as -n unless the arguments give one.
#   scripts/mqadmin.sh clusterList
#   scripts/mqadmin.sh getBrokerConfig -b 127.0.0.1:10911
set -euo pipefail

RMQ_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.services/rocketmq"
NAMESRV="${DELAYBRIDGE_ROCKETMQ_NAMESRV:-127.0.0.1:9876}"
[[ -d "$RMQ_DIR/lib" ]] || { echo "mqadmin.sh: no $RMQ_DIR/lib (run scripts/services.sh up)" >&2; exit 1; }

args=("$@")
if (($# > 0)) && [[ "$1" != help ]] && [[ " $* " != *" -n "* ]] && [[ " $* " != *" --namesrvAddr "* ]]; then
	args+=(-n "$NAMESRV")
fi

export ROCKETMQ_HOME="$RMQ_DIR" NAMESRV_ADDR="$NAMESRV"
exec java -Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
	-Duser.home="$RMQ_DIR" -Drocketmq.home.dir="$RMQ_DIR" \
	-Drmq.logback.configurationFile=rmq.tools.logback.xml -Djava.security.egd=file:/dev/./urandom \
	-cp "$RMQ_DIR/lib/*" org.apache.rocketmq.tools.command.MQAdminStartup "${args[@]}"
