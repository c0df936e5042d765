"""Runs the fault-injection drains of tests/faults.rs and tests/ledger.rs
heavier, and writes their figures into the "Reliability under faults" and
"Exactly once under faults: the ledger" sections of bench/RESULTS.md.
Started by bench/soak, which starts DynamoDB Local and the SQS server."""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from driver import described_commit

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Reliability under faults"
LEDGER_SECTION = "## Exactly once under faults: the ledger"
FAULTS = ["lost_answer", "reset", "server_error", "throttled", "slow", "statement_error"]


def drains(test, keys, rate, seeds, suite="faults", marker="faults-report "):
    """The report lines of one test of tests/faults.rs (or another suite), and whether it passed."""
    env = dict(os.environ, SQS_ONCE_FAULTS_KEYS=str(keys), SQS_ONCE_FAULTS_RATE=str(rate),
               SQS_ONCE_FAULTS_SEEDS=",".join(map(str, seeds)))
    command = ["cargo", "test", "--locked", "-p", "sqs-once-cli", "--test", suite, test, "--", "--nocapture", "--test-threads", "1"]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    # The test harness may print a test's name on the line its output starts.
    reports = [json.loads(line[line.index(marker) + len(marker):]) for line in run.stdout.splitlines() if marker in line]
    if run.returncode != 0:
        print(run.stdout[-4000:], run.stderr[-4000:], file=sys.stderr)
    return reports, run.returncode == 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=600)
    parser.add_argument("--rates", default="0.18,0.36")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",")]
    seeds = [int(seed) for seed in args.seeds.split(",")]

    # A fresh JVM is several times slower at first: warm DynamoDB Local up with a light drain.
    drains("batched_writes", 200, 0.02, [99])
    rows = []
    for rate in rates:
        for writes, test in [("batched", "batched_writes"), ("single", "single_requests")]:
            started = time.time()
            reports, passed = drains(test, args.keys, rate, seeds)
            print(f"== {writes}, {rate:.0%}: {len(reports)} drains in {time.time() - started:.0f} s, "
                  f"{'passed' if passed else 'FAILED'}", file=sys.stderr)
            rows.append((writes, rate, reports, passed))
    ledger_rows = []
    for rate in rates:
        started = time.time()
        reports, passed = drains("every_entry_applies_once_on_a_faulty_network", args.keys, rate, seeds,
                                 suite="ledger", marker="ledger-report ")
        print(f"== ledger, {rate:.0%}: {len(reports)} drains in {time.time() - started:.0f} s, "
              f"{'passed' if passed else 'FAILED'}", file=sys.stderr)
        ledger_rows.append((rate, reports, passed))

    def total(reports, field):
        return sum(report[field] for report in reports)

    commit = described_commit()
    command_line = " ".join(["bench/soak"] + sys.argv[1:])
    lines = [SECTION, "",
             f"Written by `{command_line}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit "
             f"{commit}. "
             f"`bench/soak` (the drains of `tests/faults.rs`, heavier): {args.keys} keys per drain, seeds "
             f"{', '.join(map(str, seeds))}; three `invoke --timeout 4` processes per round get every pending "
             "message twice, until each was reported successful once; then, once every lease has ended, a copy of "
             "every message again (as SQS delivers one now and then after success), until each copy was reported "
             "successful too. A key may run twice only where the README says: its completion still "
             "unconfirmed when its process left for good (each `invoke` process is an environment never run again), "
             "and a copy after the lease; or its run cancelled at the cut-off with its handler under way (logged "
             "with its key; one body in ten sleeps 200 ms after the demo's side effect began); any other double run "
             "fails the drain. Faults are drawn per request at "
             "the rate "
             "shown, evenly over lost answers (applied, connection closed), resets (before forwarding), `500`, "
             "throttling `400` and answers held 2.6 s; a fifth of the rate again refuses single statements of a "
             "batch. Figures are sums over the seeds.", "",
             "| writes | fault rate | deliveries | rounds | requests | faults injected (lost · reset · 500 · 400 · "
             "slow · statement) | `deadline` | `store_error` | completion unconfirmed | left unconfirmed at exit | "
             "ran twice (of them: left unconfirmed at exit · cancelled at the cut-off) | lost | passed |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for writes, rate, reports, passed in rows:
        injected = " · ".join(str(sum(report["injected"][fault] for report in reports)) for fault in FAULTS)
        requests = sum(report["injected"]["requests"] for report in reports)
        lost = total(reports, "never_ran") + total(reports, "left_in_queue") + total(reports, "copies_left_in_queue")
        lines.append(
            f"| {writes} | {rate:.0%} | {total(reports, 'deliveries')} | {total(reports, 'rounds')} | {requests} | "
            f"{injected} | {total(reports, 'deadline')} | {total(reports, 'store_error')} | "
            f"{total(reports, 'completion_unconfirmed')} | {total(reports, 'left_unconfirmed_at_exit')} | "
            f"{total(reports, 'ran_twice')} ({total(reports, 'ran_twice_left_unconfirmed')} · "
            f"{total(reports, 'ran_twice_cancelled_at_the_cutoff')}) | {lost} | "
            f"{'yes' if passed else '**no**'} |")
    lines.append("")
    ledger_lines = [LEDGER_SECTION, "",
                    f"Written by `{command_line}` at commit {commit}, with the section above. `bench/soak` runs the "
                    f"ledger drain of `tests/ledger.rs` heavier: {args.keys} entries per drain over seven accounts "
                    "(every 25th an overdraft, refused by its write's condition and moved to the dead-letter queue), "
                    "seeds " + ", ".join(map(str, seeds)) + "; the `ledger` handler stages each credit and a notice, "
                    "committed with its claim in one transaction and sent through the outbox. Deliveries as above; "
                    "faults at the rate shown on every DynamoDB request and on every notice sent to SQS. After the "
                    "drain, `sqs-once claims outbox --send` sends what the outbox still holds, and the notice queue is "
                    "read whole. Figures are sums over the seeds.", "",
                    "| fault rate | entries | deliveries | rounds | DynamoDB requests | faults injected, DynamoDB · SQS | "
                    "processed | `uncommitted` | `lease_lost` | commits landed later | transactions committed | "
                    "balances off by | notices received | notices duplicated | notices lost | left in the outbox | "
                    "passed |",
                    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for rate, reports, passed in ledger_rows:
        def checked(field):
            return sum(report["checked"][field] for report in reports)
        dynamodb_faults = sum(sum(report["dynamodb_injected"][fault] for fault in FAULTS) for report in reports)
        sqs_faults = sum(sum(report["sqs_injected"][fault] for fault in FAULTS) for report in reports)
        ledger_lines.append(
            f"| {rate:.0%} | {total(reports, 'keys')} | {total(reports, 'deliveries')} | {total(reports, 'rounds')} | "
            f"{sum(report['dynamodb_injected']['requests'] for report in reports)} | {dynamodb_faults} · {sqs_faults} | "
            f"{total(reports, 'processed')} | {total(reports, 'uncommitted')} | {total(reports, 'lease_lost')} | "
            f"{total(reports, 'commits_landed_later')} | {checked('notices_distinct')} | {checked('balances_off_by')} | "
            f"{checked('notices_received')} | {checked('notices_duplicated')} | {checked('notices_lost')} | "
            f"{checked('left_in_outbox_at_the_end')} | {'yes' if passed else '**no**'} |")
    ledger_lines.append("")
    output = Path(args.output)
    text = output.read_text() if output.exists() else ""
    for section in (SECTION, LEDGER_SECTION):
        start = text.find(section)
        if start >= 0:
            end = text.find("\n## ", start + len(section))
            text = text[:start] + text[end + 1:] if end >= 0 else text[:start]
    output.write_text(text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n" + "\n".join(ledger_lines))
    print("\n".join(lines + ledger_lines))
    sys.exit(0 if all(passed for *_, passed in rows) and all(passed for *_, passed in ledger_rows) else 1)


if __name__ == "__main__":
    main()
