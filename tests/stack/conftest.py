# TEMPORARY dev-only override (kafka/spark parts not written yet). DELETE before handing over.
import os
import pytest


@pytest.fixture(scope="session")
def stack_env():
    from eos_stack import helm, kube
    from eos_stack.common import Stack
    st = Stack()
    try:
        env = {**kube.up(st), **helm.up(st)}
    except Exception as exc:
        pytest.fail(f"stack failed: {exc}", pytrace=False)
    st.update_env(env)
    os.environ.update(env)
    return env
