"""Control hosts run etcd, NATS (JetStream) and the Dynamo frontend."""

m3_frontend_port = 8000
