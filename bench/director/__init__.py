"""The celery-director peer (item 7): files for its home folder and the driver it runs.

celery-director pins its own Celery, so it lives in a separate virtualenv; nothing here is
imported by the benchmark's own process except :mod:`bench.peer`, which writes these files
into a temporary ``DIRECTOR_HOME`` and runs them with that virtualenv's Python.
"""
