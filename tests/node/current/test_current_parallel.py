"""Metaflow's `current.parallel` names, and a Metaflow-style @parallel body (control node
listens, workers connect to `current.parallel.main_ip`) run unchanged on 2 nodes."""

from __future__ import annotations


import pytest

from flow_sdk import FlowApp, current
from flow_sdk.system.procs import free_port

app = FlowApp("metaflow-style")


@app.function(num_instances=2)
def parallel_step(port: int) -> dict:
    import socket
    import time

    from flow_sdk import current

    info = {"node_index": current.parallel.node_index, "num_nodes": current.parallel.num_nodes,
            "main_ip": current.parallel.main_ip,
            "control_task_id": current.parallel.control_task_id}
    if current.parallel.node_index == 0:  # the control node
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((current.parallel.main_ip, port))
        server.listen(current.parallel.num_nodes - 1)
        received = []
        for _ in range(current.parallel.num_nodes - 1):
            conn, _ = server.accept()
            received.append(conn.recv(1024).decode())
            conn.sendall(b"ack")
            conn.close()
        server.close()
        info["received"] = received
    else:  # a worker node
        for _ in range(600):
            try:
                client = socket.create_connection((current.parallel.main_ip, port))
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        client.sendall(f"hello from node {current.parallel.node_index}".encode())
        info["reply"] = client.recv(1024).decode()
        client.close()
    return info


def test_outside_a_task_parallel_describes_one_node() -> None:
    assert (current.parallel.node_index, current.parallel.num_nodes) == (0, 1)
    assert current.parallel.main_ip == "127.0.0.1"
    assert current.parallel.control_task_id is None


@pytest.mark.slow
def test_metaflow_style_body_talks_over_a_socket_on_two_nodes() -> None:
    task = parallel_step.spawn(free_port())
    control, worker = task.results(timeout=180)
    addresses = {n.node: n.address for n in task.nodes()}
    assert control["received"] == ["hello from node 1"]
    assert worker["reply"] == "ack"
    assert [control["node_index"], worker["node_index"]] == [0, 1]
    assert control["num_nodes"] == worker["num_nodes"] == 2
    assert control["main_ip"] == worker["main_ip"] == addresses[0]
    assert control["control_task_id"] == worker["control_task_id"] == task.task_id
