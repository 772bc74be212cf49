"""Facts of a host: pure parsers (`parse`) and the pyinfra facts that run them (`host`).

`from m3deploy import facts` gives both: `facts.parse_rdma(...)`, `facts.NvidiaSmi`, `facts.gather_facts(host)`.
"""
from m3deploy.facts.host import *  # noqa: F401,F403
from m3deploy.facts.parse import *  # noqa: F401,F403
from m3deploy.facts.parse import _int, _json  # noqa: F401
