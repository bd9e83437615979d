"""A queue pool as a concurrent.futures Executor, and as joblib's (and scikit-learn's) backend.

    python examples/executor_and_joblib.py

The joblib part needs joblib (and scikit-learn for its last step): pip install joblib scikit-learn
"""

import concurrent.futures as cf

from distributed import Client, LocalCluster

import daskqueue  # noqa: F401  (registers joblib's backend="daskqueue" once joblib is imported)
from daskqueue import ConsumerPool, QueuePool


def slow_square(x):
    return x * x


def check(x):
    if x == 13:
        raise ValueError(f"unlucky {x}")
    return x


def main():
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        queue_pool = QueuePool(client, n_queues=2, max_retries=0)  # errors here are deterministic
        consumer_pool = ConsumerPool(client, queue_pool)
        consumer_pool.start()

        with queue_pool.executor() as executor:
            futures = [executor.submit(slow_square, i) for i in range(100)]
            print("as completed:", sum(f.result() for f in cf.as_completed(futures)))
            # Lazy and ordered: at most 1,000 calls in flight, whatever the input's length.
            print("map:", sum(executor.map(slow_square, range(10_000))))
            try:
                executor.submit(check, 13).result()
            except ValueError as e:  # the task's own exception; the remote traceback is its cause
                print("raised:", repr(e), "| remote traceback ends with:",
                      e.__cause__.remote_traceback.strip().splitlines()[-1])

        try:
            import joblib
        except ImportError:
            print("joblib is not installed: skipping its part")
        else:
            with joblib.parallel_config(backend="daskqueue", queue_pool=queue_pool):
                squares = joblib.Parallel(n_jobs=-1)(joblib.delayed(slow_square)(i) for i in range(1_000))
                print("joblib:", sum(squares))
                try:
                    from sklearn.datasets import load_iris
                    from sklearn.linear_model import LogisticRegression
                    from sklearn.model_selection import cross_val_score
                except ImportError:
                    print("scikit-learn is not installed: skipping its part")
                else:
                    X, y = load_iris(return_X_y=True)
                    scores = cross_val_score(LogisticRegression(max_iter=500), X, y, cv=5, n_jobs=-1)
                    print("cross_val_score:", scores.round(3))

        consumer_pool.close()
        queue_pool.close()


if __name__ == "__main__":
    main()
