"""One Spark session for every PySpark job test: the JVM starts once."""

import pytest


@pytest.fixture(scope="session")
def spark():
    from jobs.spark import session

    spark = session("local[1]", "rocket-jobs-tests")
    yield spark
    spark.stop()
