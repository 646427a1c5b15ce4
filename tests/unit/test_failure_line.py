"""What a failed job records as its error: one line, the error inside a Spark failure rather than where it
surfaced (a job_run row and the task's last line said only "An exception was thrown from the Python worker")."""
from __future__ import annotations

from tiering.jobs.runner import failure_line


class PythonException(Exception):
    """pyspark's: its message carries the Python worker's traceback."""


class Py4JJavaError(Exception):
    """py4j's: its message carries the JVM's exception and stack."""


def test_the_python_workers_own_error_is_the_line():
    exc = PythonException(
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n  File \"/w/worker.py\", line 3, in main\n    raise OSError(why)\n"
        "OSError: When initiating multiple part upload for key 'x' in bucket 'nb': AWS Error NO_SUCH_BUCKET during "
        "CreateMultipartUpload operation: The specified bucket does not exist\n")
    assert failure_line(exc) == ("OSError: When initiating multiple part upload for key 'x' in bucket 'nb': AWS Error "
                                 "NO_SUCH_BUCKET during CreateMultipartUpload operation: The specified bucket does "
                                 "not exist")


def test_the_jvms_exception_is_the_line_not_its_stack():
    exc = Py4JJavaError("An error occurred while calling o72.getExecutorMemoryStatus.\n"
                        ": java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext.\n"
                        "This stopped SparkContext was created at:\n\norg.apache.spark.SparkContext.<init>(x.scala:1)")
    assert failure_line(exc) == "java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext."


def test_any_other_failure_is_its_type_and_first_line():
    assert failure_line(ValueError("bad thing\n  more of it")) == "ValueError: bad thing"
    assert failure_line(RuntimeError("")) == "RuntimeError"
    assert len(failure_line(OSError("x" * 5000))) == 1000
