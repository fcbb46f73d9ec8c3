"""The director task of the benchmark chain: returns at once (director records it)."""

from director import task


@task(name="NOOP")
def noop(*args, **kwargs):
    return None
