-- Fitted models and checkpoints, versioned: the FTL least-squares fit, the heat MLP weights, ...
CREATE TABLE IF NOT EXISTS model_fits (
    name          text NOT NULL,
    version       bigint NOT NULL,
    kind          text NOT NULL,
    params        jsonb NOT NULL DEFAULT '{}',
    blob          bytea,
    metrics       jsonb NOT NULL DEFAULT '{}',
    created_at_ms bigint NOT NULL,
    PRIMARY KEY (name, version)
);
