"""The message, queue and application benchmarks on the harness, one module each; the
scripts in tools/ call their ``main``:

    msgq_vs_zmq   msgq against pyzmq ipc://: latency, round trip, throughput, idle CPU (tools/bench_msgq.py;
                  what its workers run: msgq_vs_zmq_tasks)
    zmq_backend   msgq's zmq backend against raw pyzmq over tcp:// (tools/bench_zmq_backend.py)
    broadcast     BroadcastQueue against a pure-Python seed ring and mp.Queue (tools/bench_broadcast.py)
    ordered       ordered topics with 1..4 producers (tools/bench_ordered.py)
    record        vipc-camera + vipc-record, lossless against lossy (tools/bench_record.py)
    pipeline      the Spark jobs against pandas and a process pool (tools/bench_pipeline.py)

The two pub/sub suites (msgq_vs_zmq, zmq_backend) share one skeleton: visionipc.bench.suite
(Plan, Runner, Suite.main).
"""
