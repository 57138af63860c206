"""spark-submit entry point of the delayq reconciliation job (same as ``python -m delayq.spark``).

    spark-submit --master spark://host:7077 scripts/spark_reconcile.py \
        reconcile --orders s3a://bucket/orders/ --redis-url redis://redis:6379/0

delayq must be installed in the Python that runs the driver and the executors
(PYSPARK_PYTHON / spark.pyspark.python); see docs/SPARK.md.
"""

import sys

from delayq.spark.demo import main

if __name__ == "__main__":
    sys.exit(main())
