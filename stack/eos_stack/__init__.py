"""The project's local stack of real servers on loopback: Kafka, kube-apiserver
with etcd, Spark's Kafka connector jars, helm, and Prometheus's promtool and
server (for the chart's alerting rules). Test and demo tooling only."""
