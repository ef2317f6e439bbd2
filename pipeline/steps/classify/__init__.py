"""The classify stage: train or load a classifier, score every document, keep by threshold or label buckets and topics."""
