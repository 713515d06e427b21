#!/usr/bin/env bash
# kafka-libs.sh: resolve the Kafka broker classpath (kafka_2.13 + log4j2 binding) from
# Maven Central with test/infra/pom.xml and print the directory holding the jars.
#
# The jars are cached outside the clone, keyed by version, so every clone on the
# machine shares them:  ${MANDATED_CACHE:-$HOME/.cache/mandated}/kafka-libs-$KAFKA_VERSION
# A second run only checks the cache's .complete marker. Maven's ~/.m2 is used as usual.
set -euo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cache=${MANDATED_CACHE:-$HOME/.cache/mandated}
dir=$cache/kafka-libs-$KAFKA_VERSION
# A cache from before kafka-tools joined the pom lacks its jar: resolve again.
if [ -f "$dir/.complete" ] && compgen -G "$dir/kafka-tools-$KAFKA_VERSION.jar" >/dev/null; then
	echo "$dir"
	exit 0
fi

java_bin >/dev/null
command -v mvn >/dev/null || apt_install maven

mkdir -p "$cache"
tmp=$(mktemp -d "$dir.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "resolving Kafka $KAFKA_VERSION broker jars from Maven Central into $dir"
start=$SECONDS
if ! mvn -B -Dstyle.color=never -f "$INFRA_DIR/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
	org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
	-DincludeScope=runtime -DoutputDirectory="$tmp" >"$tmp.log" 2>&1; then
	tail -n 60 "$tmp.log" >&2
	die "mvn could not resolve org.apache.kafka:kafka_2.13:$KAFKA_VERSION (full log: $tmp.log)"
fi
rm -f "$tmp.log"

core=$tmp/kafka_2.13-$KAFKA_VERSION.jar
[ -f "$core" ] || die "kafka_2.13-$KAFKA_VERSION.jar missing after resolution"
# Zip central directories store entry names in plain text, so grep finds classes without unzip.
for class in kafka.Kafka "$KAFKA_STORAGE_TOOL_CLASS"; do
	if ! grep -a -F "${class//.//}.class" "$core" >/dev/null; then
		found=$(grep -a -o -h -E '[A-Za-z0-9/$]*StorageTool\.class' "$tmp"/kafka*.jar | sort -u | tr '\n' ' ')
		die "$class is not in kafka_2.13-$KAFKA_VERSION.jar (StorageTool-like classes: ${found:-none}); set KAFKA_STORAGE_TOOL_CLASS or pin another KAFKA_VERSION"
	fi
done

[ -f "$tmp/kafka-tools-$KAFKA_VERSION.jar" ] || die "kafka-tools-$KAFKA_VERSION.jar missing after resolution"
touch "$tmp/.complete"
# An older, complete cache without kafka-tools is replaced.
if [ -f "$dir/.complete" ] && [ ! -f "$dir/kafka-tools-$KAFKA_VERSION.jar" ]; then
	rm -rf "$dir"
fi
if ! mv -T "$tmp" "$dir" 2>/dev/null; then
	# Another run finished first; use its copy (the trap removes ours).
	[ -f "$dir/.complete" ] || die "could not move $tmp to $dir"
else
	trap - EXIT
fi
log "resolved $(find "$dir" -name '*.jar' | wc -l) jars in $((SECONDS - start))s"
echo "$dir"
