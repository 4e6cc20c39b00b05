use elastrec_embedding::{EmbeddingConfig, EmbeddingError, EmbeddingStore, SparseOptimizerConfig};

#[test]
fn toml_defaults_fill_every_field_but_rows() {
    let cfg: EmbeddingConfig = toml::from_str("rows = [10, 20]").unwrap();
    assert_eq!(cfg, EmbeddingConfig::with_rows(vec![10, 20]));
    assert_eq!(cfg.dim, 16);
    assert_eq!(cfg.optimizer, SparseOptimizerConfig::default());
    let cfg: EmbeddingConfig =
        toml::from_str("rows = [5]\ndim = 4\n[optimizer]\ntype = \"sgd\"\nlr = 0.5\n").unwrap();
    assert_eq!(cfg.optimizer, SparseOptimizerConfig::Sgd { lr: 0.5 });
    let back: EmbeddingConfig =
        serde_json::from_str(&serde_json::to_string(&cfg).unwrap()).unwrap();
    assert_eq!(back, cfg);
}

#[test]
fn typos_are_rejected() {
    assert!(toml::from_str::<EmbeddingConfig>("rows = [5]\ndims = 4").is_err());
    assert!(toml::from_str::<EmbeddingConfig>(
        "rows = [5]\n[optimizer]\ntype = \"sgd\"\nlearning_rate = 1.0"
    )
    .is_err());
    assert!(
        toml::from_str::<EmbeddingConfig>("dim = 4").is_err(),
        "rows is required"
    );
}

#[test]
fn bad_configs_are_reported() {
    let mut cfg = EmbeddingConfig::with_rows(vec![3, 0]);
    assert_eq!(
        EmbeddingStore::new(cfg.clone()).unwrap_err(),
        EmbeddingError::ZeroRows { table: 1 }
    );
    cfg.rows = vec![];
    assert_eq!(
        EmbeddingStore::new(cfg.clone()).unwrap_err(),
        EmbeddingError::NoTables
    );
    cfg.rows = vec![3];
    cfg.dim = 0;
    assert_eq!(
        EmbeddingStore::new(cfg.clone()).unwrap_err(),
        EmbeddingError::ZeroDim
    );
    cfg.dim = 2;
    cfg.optimizer = SparseOptimizerConfig::Sgd { lr: f32::NAN };
    assert!(matches!(
        EmbeddingStore::new(cfg.clone()),
        Err(EmbeddingError::Optimizer { .. })
    ));
    cfg.optimizer = SparseOptimizerConfig::RowWiseAdagrad {
        lr: 0.1,
        eps: 0.0,
        initial_accumulator: 0.0,
    };
    assert!(matches!(
        EmbeddingStore::new(cfg.clone()),
        Err(EmbeddingError::Optimizer { .. })
    ));
    assert!(matches!(
        EmbeddingStore::new_shard(
            EmbeddingConfig::with_rows(vec![3]),
            elastrec_embedding::ShardSpec { index: 2, count: 2 }
        ),
        Err(EmbeddingError::InvalidShard { index: 2, count: 2 })
    ));
}
