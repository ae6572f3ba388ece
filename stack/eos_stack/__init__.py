"""The project's local stack of real servers on loopback: Kafka, kube-apiserver
with etcd, Spark's Kafka connector jars and helm. Test and demo tooling only."""
