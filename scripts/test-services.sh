# Starts PostgreSQL and an S3-compatible server (moto) on loopback for the tests of the scaled
# storage path, exports CARET_TEST_DATABASE_URL, CARET_TEST_OBJECT_STORE and the AWS_* settings,
# and stops both when the calling shell exits. Source it:  . scripts/test-services.sh
# Needs Debian's postgresql and `pip install 'moto[server]'` (.ci/run installs both).

svc_dir=$(mktemp -d)
chmod 755 "$svc_dir"
pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
pg_port=${CARET_TEST_PG_PORT:-55432}
s3_port=${CARET_TEST_S3_PORT:-55433}
mkdir -p "$svc_dir/pg" "$svc_dir/sock"
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    chown postgres:postgres "$svc_dir/pg" "$svc_dir/sock"
    su postgres -s /bin/sh -c "$*"
  else
    sh -c "$*"
  fi
}
as_pg "'$pg_bin/initdb' -D '$svc_dir/pg' -A trust -U caret >/dev/null"
as_pg "'$pg_bin/pg_ctl' -D '$svc_dir/pg' -l '$svc_dir/sock/pg.log' -o \"-p $pg_port -k $svc_dir/sock -c listen_addresses=127.0.0.1\" -w start >/dev/null"
as_pg "'$pg_bin/createdb' -h 127.0.0.1 -p $pg_port -U caret caret_test"
export CARET_TEST_DATABASE_URL="postgres://caret@127.0.0.1:$pg_port/caret_test"

python3 -m moto.server -H 127.0.0.1 -p "$s3_port" >"$svc_dir/moto.log" 2>&1 &
moto_pid=$!
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
export AWS_ENDPOINT="http://127.0.0.1:$s3_port" AWS_ALLOW_HTTP=true
for _ in $(seq 100); do
  python3 -c "import boto3,os; boto3.client('s3', endpoint_url=os.environ['AWS_ENDPOINT']).create_bucket(Bucket='caret-test')" 2>/dev/null && break
  sleep 0.2
done
export CARET_TEST_OBJECT_STORE=s3://caret-test

caret_stop_services() {
  as_pg "'$pg_bin/pg_ctl' -D '$svc_dir/pg' -m fast stop >/dev/null" || true
  kill "$moto_pid" 2>/dev/null || true
}
trap caret_stop_services EXIT
echo "test services: PostgreSQL on 127.0.0.1:$pg_port, S3 (moto) on 127.0.0.1:$s3_port"
