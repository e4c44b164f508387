"""The wire contract's types and decoders, one module per part of it.

- `limits`: how much an inbound message and each free-form field may hold.
- `fields`: the constrained field types and the reasons a refused value is given.
- `base`: the struct base every wire type shares, and the JSON encoders.
- `json_input`: bytes to a JSON object, its caps checked before it is parsed.
- `resources`: Sedna's Dataset, LifelongLearningJob, Model, JointInferenceService and
  FederatedLearningJob, and the downstream envelope.
- `credentials`: the S3 credential a resource's annotation names.
- `downstream`: the envelope and resource decoders and the events they yield.
- `workers`: worker reports and their decoder.
- `upstream`: statuses, rejections and presence, as the service sends them.

Other code imports these names from `service.messages`, which gathers them.
"""
