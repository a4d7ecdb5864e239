-- wrk script: POST the JSON body in $BENCH_BODY to $BENCH_PATH with the Authorization in $BENCH_AUTH
-- (default "Bearer sk-bench"), `Connection: close` when $BENCH_CLOSE is 1; print a JSON summary line in done().
local body_path = os.getenv("BENCH_BODY")
local f = assert(io.open(body_path, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.path = os.getenv("BENCH_PATH") or "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = os.getenv("BENCH_AUTH") or "Bearer sk-bench"
if os.getenv("BENCH_CLOSE") == "1" then  -- a new connection per request (wrk reconnects)
  wrk.headers["Connection"] = "close"
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
