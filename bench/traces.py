"""What tracing costs: the release binary built without the `opentelemetry`
feature (`--before`: the commit before it), this checkout's with no endpoint
set, and this checkout's sending every span to a collector on this machine (an
OTLP/HTTP sink that answers 200 to each request, as the ADOT collector layer
beside a function does), on the same events and DynamoDB Local:

1. `invoke` on new records, then on the same records again (duplicates): the
   process's CPU per record and records/s, the binaries alternating;
2. a running function's second batch of new records (`throughput lambda`),
   DynamoDB Local 5 ms away (`throughput delay-proxy`): delivery to answer, the
   spans' export before the answer included.

Writes the "Tracing's cost" section of bench/RESULTS.md. Started by bench/traces."""

import argparse
import http.server
import os
import threading

import driver
from driver import Network, create_table, event, fmt, revision, summary, write_section

SECTION = "## Tracing's cost"


class Sink(http.server.BaseHTTPRequestHandler):
    """Takes an OTLP/HTTP export and answers 200, counting requests and bytes."""

    requests = 0
    bytes = 0

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Sink.requests, Sink.bytes = Sink.requests + 1, Sink.bytes + len(body)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


def consumers(before, after, collector):
    """(name, binary, extra environment) of each consumer measured."""
    return [("without the feature", before, {}), ("no endpoint", after, {}),
            ("exporting", after, {"OTEL_EXPORTER_OTLP_ENDPOINT": collector, "OTEL_BSP_MAX_QUEUE_SIZE": "100000"})]


def with_env(extra, run):
    saved = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        return run()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="the release binary without the feature")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--latency-sizes", default="100,1000")
    parser.add_argument("--output", default=str(driver.ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    collector = f"http://127.0.0.1:{server.server_address[1]}"
    measured = consumers(driver.Path(args.before), driver.BINARY, collector)
    sizes = [int(size) for size in args.sizes.split(",")]
    results = {}
    for run in range(args.runs):
        order = measured if run % 2 == 0 else list(reversed(measured))
        for size in sizes:
            for name, binary, extra in order:
                driver.BINARY = binary
                table = create_table()
                path = event("new", size)
                for kind in ("new", "duplicates"):
                    sample = with_env(extra, lambda: driver.sqs_once(table, path, size))
                    results.setdefault((name, size, kind), []).append(sample)
                path.unlink()
    latencies = {}
    with Network(5) as network:
        for run in range(args.runs):
            for size in [int(size) for size in args.latency_sizes.split(",")]:
                for name, binary, extra in measured[1:]:
                    driver.BINARY = binary
                    path = event("new", size)
                    ms = with_env(extra, lambda: driver.warm_lambda_batch(create_table(), path, network.url))
                    latencies.setdefault((name, size), []).append(ms)
                    path.unlink()
    lines = [SECTION, "", f"`bench/traces` at {revision()} against the release binary at `--before` (built without the "
             f"feature), medians of {args.runs} [min–max], consumers alternating, DynamoDB Local on this machine; the "
             f"collector is a sink on this machine that answers 200 ({Sink.requests:,} exports, "
             f"{Sink.bytes / Sink.requests / 1024:,.1f} KiB each on average).", "",
             "| measure | without the feature | no endpoint | exporting | no endpoint / without | exporting / no endpoint |",
             "|---|---:|---:|---:|---:|---:|"]
    for size in sizes:
        for kind in ("new", "duplicates"):
            for field, label, digits in (("cpu_ms_per_record", "CPU ms per record", 4), ("records_per_s", "records/s", 0)):
                stats = [summary([sample[field] for sample in results[(name, size, kind)]]) for name, _, _ in measured]
                ratios = [stats[1]["median"] / stats[0]["median"], stats[2]["median"] / stats[1]["median"]]
                lines.append(f"| {size:,} {kind}: {label} | " + " | ".join(fmt(stat, digits) for stat in stats)
                             + " | " + " | ".join(f"{ratio:.2f}" for ratio in ratios) + " |")
    for size in [int(size) for size in args.latency_sizes.split(",")]:
        off, on = (summary(latencies[(name, size)]) for name, _, _ in measured[1:])
        lines.append(f"| {size:,} new records, a warm function's batch at a 5 ms round trip: ms to answer | – | "
                     f"{fmt(off, 1)} | {fmt(on, 1)} | – | {on['median'] / off['median']:.2f} |")
    lines.append("")
    write_section(args.output, SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
