-- `delivery_endpoint (endpoint_id)` is a prefix of `delivery_endpoint_status (endpoint_id, status, seq)`:
-- every lookup by endpoint (the cascade when an endpoint is deleted among them) can use the longer one,
-- while each index costs every ingested delivery one more B-tree insert on the one writer.
DROP INDEX IF EXISTS delivery_endpoint;
