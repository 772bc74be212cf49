"""Hand-built ClusterPlans for the control-plane/worker tests: the Service shapes the roles and
templates expect from plan.build (measured on Dynamo 1.6.1, see docs/DYNAMO.md)."""
from m3deploy.core import settings
from m3deploy.core.model import ClusterPlan, HostPlan, Port, Readiness, Service, WorkerPlan

VENV = "/opt/m3/dynamo-1.6.1"
MODEL_DIR = "/opt/m3/models/mock-minimax-m3"
NAME = "MiniMaxAI/MiniMax-M3"


def dynamo_env(addr, ctl, home):
    return (
        ("HOME", home), ("HF_HUB_OFFLINE", "1"),
        ("ETCD_ENDPOINTS", f"http://{ctl}:2379"), ("ETCD_AUTH_USERNAME", "m3"),
        ("NATS_SERVER", f"nats://{ctl}:4222"), ("NATS_AUTH_USERNAME", "m3"),
        ("DYN_REQUEST_PLANE", "tcp"), ("DYN_EVENT_PLANE", "nats"),
        ("DYN_TCP_RPC_HOST", addr), ("DYN_TCP_RESPONSE_STREAM_HOST", addr),
        ("DYN_EVENT_PLANE_HOST", addr), ("DYN_SYSTEM_HOST", addr),
    )


DYN_SECRETS = (("ETCD_AUTH_PASSWORD", "etcd-password"), ("NATS_AUTH_PASSWORD", "nats-password"))


def etcd(host, a):
    return Service(
        name="etcd", kind="etcd", host=host,
        argv=("etcd", "--name", host, "--data-dir", "/var/lib/m3/etcd/data",
              "--listen-client-urls", f"http://{a}:2379", "--advertise-client-urls", f"http://{a}:2379",
              "--listen-peer-urls", f"http://{a}:2380", "--initial-advertise-peer-urls", f"http://{a}:2380",
              "--initial-cluster", f"{host}=http://{a}:2380"),
        env=(("M3_ETCD_URL", f"http://{a}:2379"), ("M3_ETCD_USER", "m3")),
        secret_env=(("M3_ETCD_ROOT_PASSWORD", "etcd-root-password"), ("M3_ETCD_PASSWORD", "etcd-password")),
        ports=(Port("client", 2379, a), Port("peer", 2380, a)),
        readiness=Readiness("http", url=f"http://{a}:2379/health", expect_json=(("health", "true"),), timeout_s=60),
        env_file="/etc/m3/etcd.env", workdir="/var/lib/m3/etcd")


def nats(host, a):
    return Service(
        name="nats", kind="nats", host=host, argv=("nats-server", "-c", "/etc/m3/nats.conf"),
        env=(("NATS_AUTH_USERNAME", "m3"),), secret_env=(("NATS_AUTH_PASSWORD", "nats-password"),),
        ports=(Port("client", 4222, a), Port("monitor", 8222, a)),
        readiness=Readiness("http", url=f"http://{a}:8222/healthz?js-enabled-only=true", timeout_s=60),
        env_file="/etc/m3/nats.env", workdir="/var/lib/m3/nats")


def frontend(host, a, ctl):
    return Service(
        name="m3-frontend", kind="frontend", host=host,
        argv=(f"{VENV}/bin/python", "-m", "dynamo.frontend", "--http-host", a, "--http-port", "8000",
              "--router-mode", "kv", "--router-kv-events", "--router-temperature", "0",
              "--router-session-affinity-ttl-secs", "14400", "--kv-cache-block-size", "128",
              "--trust-remote-code", "--migration-limit", "3"),
        env=dynamo_env(a, ctl, "/var/lib/m3/m3-frontend") + (("DYN_TOKENIZER", "fastokens"),),
        secret_env=DYN_SECRETS, ports=(Port("http", 8000, a),),
        readiness=Readiness("http", url=f"http://{a}:8000/live", timeout_s=120),
        env_file="/etc/m3/m3-frontend.env", workdir="/var/lib/m3/m3-frontend", after=(f"{host}/etcd", f"{host}/nats"))


def mocker(host, a, ctl, n):
    return Service(
        name=f"m3-worker@{n}", kind="worker", host=host,
        argv=(f"{VENV}/bin/python", "-m", "dynamo.mocker", "--model-path", MODEL_DIR, "--model-name", NAME,
              "--block-size", "128", "--num-gpu-blocks-override", "2048", "--speedup-ratio", "10"),
        env=dynamo_env(a, ctl, f"/var/lib/m3/m3-worker@{n}") + (
            ("DYN_SYSTEM_PORT", "9090"), ("DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS", '["generate"]')),
        secret_env=DYN_SECRETS, ports=(Port("system", 9090, a),),
        readiness=Readiness("http", url=f"http://{a}:9090/health", timeout_s=120),
        env_file=f"/etc/m3/m3-worker@{n}.env", workdir=f"/var/lib/m3/m3-worker@{n}", worker=n)


def gpu_worker(host, a, ctl, n=0):
    return Service(
        name=f"m3-worker@{n}", kind="worker", host=host, image="vllm/vllm-openai:nightly-5555a2d8",
        docker_args=("--gpus", "all", "--network", "host", "--ipc", "host", "-v", "/data/hf:/root/.cache/huggingface"),
        argv=("python3", "-m", "dynamo.vllm", "--model", "nvidia/MiniMax-M3-NVFP4", "--block-size", "128",
              "--attention-config", '{"backend":"FLASHINFER","use_trtllm_attention":true}',
              "--kv-events-config", '{"publisher":"zmq","topic":"kv-events","endpoint":"tcp://*:5200"}'),
        env=dynamo_env(a, ctl, "/root") + (("DYN_SYSTEM_PORT", "9090"),
                                           ("DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS", '["generate"]'),
                                           ("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "trtllm")),
        secret_env=DYN_SECRETS, ports=(Port("system", 9090, a),),
        readiness=Readiness("http", url=f"http://{a}:9090/health", timeout_s=1800),
        env_file=f"/etc/m3/m3-worker@{n}.env", workdir=f"/var/lib/m3/m3-worker@{n}", worker=n)


def sim_plan(name="testbed"):
    ctl, w1, w2 = "10.77.0.2", "10.77.0.3", "10.77.0.4"
    hosts = (
        HostPlan("ctl", ctl, ("control",), platform="sim",
                 services=(etcd("ctl", ctl), nats("ctl", ctl), frontend("ctl", ctl, ctl))),
        HostPlan("w1", w1, ("workers",), platform="sim", services=(mocker("w1", w1, ctl, 0),)),
        HostPlan("w2", w2, ("workers",), platform="sim", services=(mocker("w2", w2, ctl, 1),)),
    )
    return ClusterPlan(
        name=name, platform="sim", variant="mock", parallel="dp", engine="mocker", serving="dynamo",
        features=(), model_id=NAME, served_model_name=NAME, max_model_len=None, state="present",
        hosts=hosts, workers=(WorkerPlan(0, ("w1",), 1, 1, 0, ("w1/m3-worker@0",)),
                              WorkerPlan(1, ("w2",), 1, 1, 0, ("w2/m3-worker@1",))),
        endpoint=f"http://{ctl}:8000/v1", etcd_endpoints=f"http://{ctl}:2379", nats_server=f"nats://{ctl}:4222",
        dynamo_version="1.6.1", venv=VENV, model_dir=MODEL_DIR,
        settings=tuple(sorted((k, settings.KEYS[k].default) for k in settings.CLUSTER_KEYS)))
