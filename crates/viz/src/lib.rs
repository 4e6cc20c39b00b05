//! What a person looks at: charts (`elastrec plot`) and a live dashboard
//! (`elastrec dashboard`).

pub mod chart;
pub mod dashboard;
pub mod plot;
