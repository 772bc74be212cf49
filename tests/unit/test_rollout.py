"""m3deploy.check.rollout against a local HTTP server that answers like Dynamo 1.6.1's frontend /health and a worker's
system-port /metrics (shapes measured on the testbed: instance ids in /health are decimal, the `worker_id`
label is the same id in hex; a restarted worker's old entry stays listed until its lease expires)."""
import http.server
import json
import threading

import pytest

from m3deploy.check import rollout
from m3deploy.check.readiness import NotReady

OLD, NEW, OTHER = 756501595585796121, 756501595585796134, 756501595585796145


@pytest.fixture
def dynamo():
    st = {"listed": [OLD, OTHER], "listed2": [OLD, OTHER], "worker": {"w1": (OLD, 5), "w2": (OTHER, 0)}, "sent": 0}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.endswith("/health"):  # /health: the first frontend, /fe2/health: a second one
                body = json.dumps({"status": "healthy", "instances": [
                    {"endpoint": "generate", "instance_id": i, "transport": {"tcp": f"10.0.0.1:1/{i:x}"}}
                    for i in st["listed" if self.path == "/health" else "listed2"]] + [{"endpoint": "worker_kv_query_source_x", "instance_id": 1}]})
            else:
                wid, served = st["worker"][self.path.strip("/").split("/")[0]]
                body = (f'dynamo_component_inflight_requests{{dynamo_endpoint="generate",worker_id="{wid:x}"}} 0\n'
                        f'dynamo_component_requests_total{{dynamo_endpoint="generate",worker_id="{wid:x}"}} {served}\n')
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_port}"
    yield url, st
    srv.shutdown()


def test_batches_in_plan_order():
    assert rollout.batches([0, 1, 2], 1) == [[0], [1], [2]]
    assert rollout.batches([0, 1, 2], 2) == [[0, 1], [2]]
    assert rollout.batches([], 1) == []


def test_worker_counts_and_listed_ids(dynamo):
    url, _ = dynamo
    assert rollout.worker_counts(f"{url}/w1/metrics") == {format(OLD, "x"): 5.0}
    assert rollout.listed_ids(f"{url}/health") == {format(OLD, "x"), format(OTHER, "x")}


def test_wait_workers_ignores_a_stale_entry(dynamo):
    """Two `generate` entries for two planned workers is not enough when one is the dead process's old entry."""
    url, st = dynamo
    heads = {"h1/m3-worker@0": f"{url}/w1/metrics", "h2/m3-worker@0": f"{url}/w2/metrics"}
    assert rollout.wait_workers(f"{url}/health", heads, timeout_s=1) < 1
    st["worker"]["w1"] = (NEW, 0)  # w1 restarted; the frontend still lists its old id (and the other worker)
    with pytest.raises(NotReady, match="h1/m3-worker@0: worker ids") as e:
        rollout.wait_workers(f"{url}/health", heads, timeout_s=0.3, interval_s=0.1)
    assert "h2/m3-worker@0" not in str(e.value).split("last:")[1]
    st["listed"].append(NEW)
    assert rollout.wait_workers(f"{url}/health", heads, timeout_s=1) < 1


def test_wait_routable_needs_the_new_process_listed_and_serving(dynamo):
    url, st = dynamo
    old = {format(OLD, "x")}
    st["worker"]["w1"] = (NEW, 0)

    def send():
        st["sent"] += 1
        if NEW in st["listed"]:
            st["worker"]["w1"] = (NEW, 1)  # the frontend routed it to the new process
    with pytest.raises(NotReady, match="not listed"):
        rollout.wait_routable("h1/m3-worker@0", f"{url}/health", f"{url}/w1/metrics", old, send, timeout_s=0.3,
                              interval_s=0.1)
    assert st["sent"] == 0  # no request is sent before the new process is listed
    st["listed"].append(NEW)
    assert rollout.wait_routable("h1/m3-worker@0", f"{url}/health", f"{url}/w1/metrics", old, send,
                                 timeout_s=2, interval_s=0.05) < 2
    assert st["sent"] >= 1


def test_wait_routable_waits_for_every_frontend_to_list_the_new_process(dynamo):
    """Issue 38: the next old instance drains only once every frontend lists the new one, not just the first."""
    url, st = dynamo
    old = {format(OLD, "x")}
    st["worker"]["w1"] = (NEW, 1)
    st["listed"].append(NEW)  # the first frontend lists and served it; the second does not list it yet
    with pytest.raises(NotReady, match="fe2/health"):
        rollout.wait_routable("h1/m3-worker@0", f"{url}/health", f"{url}/w1/metrics", old, lambda: None,
                              timeout_s=0.3, interval_s=0.1, also=[f"{url}/fe2/health"])
    st["listed2"].append(NEW)
    assert rollout.wait_routable("h1/m3-worker@0", f"{url}/health", f"{url}/w1/metrics", old, lambda: None,
                                 timeout_s=2, interval_s=0.05, also=[f"{url}/fe2/health"]) < 2
