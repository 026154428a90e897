"""A Snowflake ML Jobs script, changed only in its imports and its data source: it runs on the
head node, and the distributed trainers it calls use the job's nodes."""

import numpy as np
import pandas as pd

from flow_sdk.data import DataConnector
from flow_sdk.trainers import PyTorchDistributor, XGBEstimator, XGBScalingConfig, get_context


def train_func():
    import os

    import torch
    import torch.distributed as dist

    context = get_context()
    dist.init_process_group(backend="gloo")
    total = torch.tensor([float(context.get_rank() + 1)])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {"rank": context.get_rank(), "world_size": context.get_world_size(),
            "node": context.get_node_rank(), "sum": float(total.item()),
            "task": os.environ["FLOW_TASK_ID"]}


rng = np.random.default_rng(0)
rows = 3 * 65_536  # an in-memory table shards in blocks of 65,536 rows: one per worker
features = rng.normal(size=(rows, 2)).astype(np.float32)
frame = pd.DataFrame({"age": features[:, 0], "income": features[:, 1],
                      "risk": features[:, 0] * 2.0 - features[:, 1]})
train_connector = DataConnector.from_dataframe(frame)

estimator = XGBEstimator(
    params={"objective": "reg:squarederror", "max_depth": 3, "learning_rate": 0.3},
    n_estimators=4,
    scaling_config=XGBScalingConfig(num_workers=-1, num_cpu_per_worker=-1),
)
booster = estimator.fit(dataset=train_connector, input_cols=["age", "income"],
                        label_col="risk")
print(f"xgboost trained on {len(estimator.worker_info)} workers", flush=True)

response = PyTorchDistributor(train_func=train_func).run()
print(f"pytorch ran on {len(response.results)} workers", flush=True)

__return__ = {
    "xgb": [(info["rank"], info["node"], info["world_size"]) for info in estimator.worker_info],
    "rounds": booster.num_boosted_rounds(),
    "torch": response.results,
    "model_dir": response.get_model_dir(),
}
