"""Models, joint-inference services and federated-learning jobs, hand-written to the shape of
Sedna's own examples (`kubectl create -f` manifests), and their workers' reports as Sedna's
worker library sends them. Shared by the wire, CLI and service tests."""

from __future__ import annotations

from typing import Any

import yaml

#: Sedna's Model examples: a local path and a format; one with device SoC versions.
MODEL_YAML = """\
apiVersion: sedna.io/v1alpha1
kind: Model
metadata:
  name: little-model
  namespace: default
spec:
  url: "/data/little-model/yolov3_resnet18.pb"
  format: "pb"
---
apiVersion: sedna.io/v1alpha1
kind: Model
metadata:
  name: "fl-model"
spec:
  url: "/model"
  format: "pb"
  device_soc_versions: ["Ascend310", "Ascend710"]
"""

#: Sedna's joint-inference example: an edge worker with hard-example mining on $EDGE_NODE
#: (here: edge-node), a cloud worker on the cloud node, both with unknown-to-us pod fields.
JOINT_INFERENCE_YAML = """\
apiVersion: sedna.io/v1alpha1
kind: JointInferenceService
metadata:
  name: helmet-detection-inference-example
  namespace: default
spec:
  edgeWorker:
    model:
      name: "little-model"
    hardExampleMining:
      name: "IBT"
      parameters:
        - key: "threshold_img"
          value: "0.9"
        - key: "threshold_box"
          value: "0.9"
    template:
      spec:
        nodeName: edge-node
        containers:
          - image: kubeedge/sedna-example-joint-inference-helmet-detection-little:v0.3.0
            imagePullPolicy: IfNotPresent
            name: little-model
            env:
              - name: input_shape
                value: "416,736"
            resources:
              requests: {memory: 64M, cpu: 100m}
            volumeMounts:
              - name: outputdir
                mountPath: /data/
        volumes:
          - name: outputdir
            hostPath: {path: /joint_inference/output, type: Directory}
  cloudWorker:
    model:
      name: "big-model"
    template:
      spec:
        nodeName: cloud-node
        containers:
          - image: kubeedge/sedna-example-joint-inference-helmet-detection-big:v0.3.0
            name: big-model
            imagePullPolicy: IfNotPresent
            env:
              - name: "input_shape"
                value: "544,544"
"""

#: Sedna's federated-learning example: an aggregation worker in the cloud and two training
#: workers on two edge nodes, with a pretrained model and both transmitters.
FEDERATED_LEARNING_YAML = """\
apiVersion: sedna.io/v1alpha1
kind: FederatedLearningJob
metadata:
  name: yolo-v5
spec:
  pretrainedModel:
    name: "yolo-v5-pretrained-model"
  transmitter:
    ws: {}
    s3:
      aggDataPath: "s3://sedna/fl/aggregation_data"
      credentialName: mysecret
  aggregationWorker:
    model:
      name: "fl-model"
    template:
      spec:
        nodeName: cloud-node
        containers:
          - image: kubeedge/sedna-example-federated-learning-mistnet-yolo-aggregator:v0.4.0
            name: agg-worker
            imagePullPolicy: IfNotPresent
            env:
              - name: "exit_round"
                value: "3"
  trainingWorkers:
    - dataset:
        name: "coco-dataset-1"
      template:
        spec:
          nodeName: edge-node
          containers:
            - image: kubeedge/sedna-example-federated-learning-mistnet-yolo-client:v0.4.0
              name: train-worker
              args: ["-i", "1"]
    - dataset:
        name: "coco-dataset-2"
      template:
        spec:
          nodeName: edge-node-2
          containers:
            - image: kubeedge/sedna-example-federated-learning-mistnet-yolo-client:v0.4.0
              name: train-worker
              args: ["-i", "2"]
"""

MODELS: list[dict[str, Any]] = list(yaml.safe_load_all(MODEL_YAML))
MODEL: dict[str, Any] = MODELS[0]
JOINT_INFERENCE: dict[str, Any] = yaml.safe_load(JOINT_INFERENCE_YAML)
FEDERATED_LEARNING: dict[str, Any] = yaml.safe_load(FEDERATED_LEARNING_YAML)

#: What Sedna's joint-inference library reports every period: no `status`, the counts in
#: ownerInfo, from the edge worker (WORKER_NAME `edgeworker-<5 random characters>`).
JI_REPORT: dict[str, Any] = {
    "name": "edgeworker-x7k2p",
    "namespace": "default",
    "ownerName": "helmet-detection-inference-example",
    "ownerKind": "jointinferenceservice",
    "kind": "inference",
    "results": [],
    "ownerInfo": {
        "startTime": "2026-12-04 10:00:00",
        "updateTime": "2026-12-04 10:00:30",
        "inferenceNumber": 120,
        "hardExampleNumber": 9,
        "uploadCloudRatio": 0.075,
    },
}

#: What Sedna's federated-learning library reports after a round (`report_task_info`).
FL_REPORT: dict[str, Any] = {
    "name": "trainworker-q9z3m",
    "namespace": "default",
    "ownerName": "yolo-v5",
    "ownerKind": "federatedlearningjob",
    "kind": "train",
    "status": "running",
    "ownerInfo": {
        "currentRound": 2,
        "sampleCount": 640,
        "startTime": "2026-12-04 10:00:00",
        "updateTime": "2026-12-04 10:05:00",
    },
    "results": [{"format": "pb", "url": "/model/yolov5.pb", "metrics": {"loss": [0.42]}}],
}
