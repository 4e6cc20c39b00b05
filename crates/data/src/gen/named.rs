//! A shop's click log with named columns, lists and a hidden teacher
//! (`elastrec gen-data --named`): ground truth for the named-feature path.
//!
//! Columns of each `day_K.parquet` (or, with [`NamedSpec::csv`], `day_K.csv` with a
//! header, lists joined by `|`, a null price empty):
//! - `click` (`int32`, 0/1): the label;
//! - `user_id` (`int64`), `item_id` (`string`, `item-N`), `device` (`string`);
//! - `price` (`double`, nullable, long-tailed);
//! - `genres` (`list<string>`): the candidate item's 1 to 4 genres;
//! - `hist_items` (`list<string>`, `item-N` like `item_id`): the user's recently clicked
//!   items, most recent last, 0 to [`HISTORY_MAX`] of them.
//!
//! The teacher: each row has a hidden interest, a genre drawn from the user's two
//! favourites (80%) or at random. Most of the history comes from items of that genre.
//! The click logit rises when the candidate's genres hold the interest, with the item's
//! own appeal, its price and the device. Only the history tells the interest of the row,
//! so a model that reads `hist_items` (through the item table it shares with `item_id`)
//! can beat one that does not.

use super::rng::Rng;
use crate::error::{DataError, Result};
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Users of the generated log.
pub const USERS: u64 = 2_000;
/// Items.
pub const ITEMS: u64 = 5_000;
/// Genres.
pub const GENRES: u64 = 24;
/// Longest history generated (a job that keeps fewer cuts the rest).
pub const HISTORY_MAX: usize = 30;
const DEVICES: [&str; 3] = ["ios", "android", "web"];

/// What [`generate_named`] writes.
#[derive(Debug, Clone)]
pub struct NamedSpec {
    /// Output directory (created).
    pub out: PathBuf,
    /// Rows over all files.
    pub rows: u64,
    /// Files `day_0.parquet`..: the last is the natural held-out day.
    pub days: u32,
    /// Same seed, same rows.
    pub seed: u64,
    /// CSV files with a header instead of Parquet.
    pub csv: bool,
}

/// What [`generate_named`] wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NamedReport {
    /// The files, in day order.
    pub files: Vec<PathBuf>,
    /// Rows written.
    pub rows: u64,
    /// Share of clicks.
    pub click_rate: f64,
    /// AUC of the teacher's own logits: the ceiling a model can reach.
    pub teacher_auc: f64,
}

/// The hidden world: every item's genres and appeal, every user's favourite genres.
struct World {
    item_genres: Vec<Vec<u64>>,
    item_appeal: Vec<f64>,
    items_of_genre: Vec<Vec<u64>>,
    user_favs: Vec<[u64; 2]>,
}

impl World {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x6e61_6d65_6400_0000);
        let mut items_of_genre = vec![Vec::new(); GENRES as usize];
        let mut item_genres = Vec::with_capacity(ITEMS as usize);
        let mut item_appeal = Vec::with_capacity(ITEMS as usize);
        for item in 0..ITEMS {
            let k = 1 + (rng.next_u64() % 4) as usize;
            let mut genres: Vec<u64> = Vec::with_capacity(k);
            while genres.len() < k {
                let g = rng.next_u64() % GENRES;
                if !genres.contains(&g) {
                    genres.push(g);
                }
            }
            for &g in &genres {
                items_of_genre[g as usize].push(item);
            }
            item_genres.push(genres);
            item_appeal.push(normal(&mut rng) * 0.6);
        }
        let user_favs = (0..USERS)
            .map(|_| {
                let a = rng.next_u64() % GENRES;
                let b = (a + 1 + rng.next_u64() % (GENRES - 1)) % GENRES;
                [a, b]
            })
            .collect();
        Self {
            item_genres,
            item_appeal,
            items_of_genre,
            user_favs,
        }
    }
}

fn normal(rng: &mut Rng) -> f64 {
    // Box-Muller; `1 - u` keeps the logarithm finite.
    let (u, v) = (1.0 - rng.f64(), rng.f64());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// One generated row.
struct Row {
    click: bool,
    logit: f64,
    user: u64,
    item: u64,
    device: usize,
    price: Option<f64>,
    hist: Vec<u64>,
}

fn row(world: &World, rng: &mut Rng) -> Row {
    let user = rng.next_u64() % USERS;
    let interest = if rng.f64() < 0.8 {
        world.user_favs[user as usize][(rng.next_u64() % 2) as usize]
    } else {
        rng.next_u64() % GENRES
    };
    let len = (rng.next_u64() % (HISTORY_MAX as u64 + 1)) as usize;
    let hist = (0..len)
        .map(|_| {
            if rng.f64() < 0.75 {
                let pool = &world.items_of_genre[interest as usize];
                pool[(rng.next_u64() % pool.len() as u64) as usize]
            } else {
                rng.next_u64() % ITEMS
            }
        })
        .collect();
    // Half the candidates come from the interest's genre, so both outcomes are common.
    let item = if rng.f64() < 0.5 {
        let pool = &world.items_of_genre[interest as usize];
        pool[(rng.next_u64() % pool.len() as u64) as usize]
    } else {
        rng.next_u64() % ITEMS
    };
    let device = (rng.next_u64() % DEVICES.len() as u64) as usize;
    let raw_price = (normal(rng) * 0.8 + 3.0).exp();
    let price = (rng.f64() >= 0.05).then_some(raw_price);
    let matches = world.item_genres[item as usize].contains(&interest);
    let logit = -1.3 + if matches { 2.2 } else { 0.0 } + world.item_appeal[item as usize]
        - 0.35 * (raw_price.ln() - 3.0)
        + [0.2, 0.0, -0.2][device];
    let click = rng.f64() < 1.0 / (1.0 + (-logit).exp());
    Row {
        click,
        logit,
        user,
        item,
        device,
        price,
        hist,
    }
}

fn item_name(item: u64) -> String {
    format!("item-{item}")
}

fn write_file(path: &Path, rows: &[Row], world: &World) -> Result<()> {
    let click: Int32Array = rows.iter().map(|r| Some(i32::from(r.click))).collect();
    let user: Int64Array = rows.iter().map(|r| Some(r.user as i64)).collect();
    let item: StringArray = rows.iter().map(|r| Some(item_name(r.item))).collect();
    let device: StringArray = rows.iter().map(|r| Some(DEVICES[r.device])).collect();
    let price: Float64Array = rows.iter().map(|r| r.price).collect();
    let mut genres = ListBuilder::new(StringBuilder::new());
    let mut hist = ListBuilder::new(StringBuilder::new());
    for r in rows {
        for g in &world.item_genres[r.item as usize] {
            genres.values().append_value(format!("genre-{g}"));
        }
        genres.append(true);
        for &h in &r.hist {
            hist.values().append_value(item_name(h));
        }
        hist.append(true);
    }
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("click", Arc::new(click)),
        ("user_id", Arc::new(user)),
        ("item_id", Arc::new(item)),
        ("device", Arc::new(device)),
        ("price", Arc::new(price)),
        ("genres", Arc::new(genres.finish())),
        ("hist_items", Arc::new(hist.finish())),
    ];
    let batch = RecordBatch::try_from_iter(columns).map_err(|e| DataError::parquet(path, e))?;
    let file = File::create(path).map_err(|e| DataError::io(path, e))?;
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(16 * 1024))
        .build();
    let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props))
        .map_err(|e| DataError::parquet(path, e))?;
    w.write(&batch).map_err(|e| DataError::parquet(path, e))?;
    w.close().map_err(|e| DataError::parquet(path, e))?;
    Ok(())
}

fn write_csv(path: &Path, rows: &[Row], world: &World) -> Result<()> {
    use std::fmt::Write as _;
    let mut text = String::from("click,user_id,item_id,device,price,genres,hist_items\n");
    let joined = |ids: &mut dyn Iterator<Item = String>| ids.collect::<Vec<_>>().join("|");
    for r in rows {
        let price = r.price.map(|p| p.to_string()).unwrap_or_default();
        let genres = joined(
            &mut world.item_genres[r.item as usize]
                .iter()
                .map(|g| format!("genre-{g}")),
        );
        let hist = joined(&mut r.hist.iter().map(|&h| item_name(h)));
        let _ = writeln!(
            text,
            "{},{},{},{},{price},{genres},{hist}",
            u8::from(r.click),
            r.user,
            item_name(r.item),
            DEVICES[r.device],
        );
    }
    std::fs::write(path, text).map_err(|e| DataError::io(path, e))
}

/// Writes the log of `spec` (see the module documentation).
pub fn generate_named(spec: &NamedSpec) -> Result<NamedReport> {
    if spec.rows == 0 || spec.days == 0 {
        return Err(DataError::InvalidSpec(
            "a named data set needs at least 1 row and 1 day".into(),
        ));
    }
    std::fs::create_dir_all(&spec.out).map_err(|e| DataError::io(&spec.out, e))?;
    let world = World::new(spec.seed);
    let mut rng = Rng::new(spec.seed);
    let (mut logits, mut labels) = (Vec::new(), Vec::new());
    let mut files = Vec::new();
    let per_day = spec.rows.div_ceil(u64::from(spec.days));
    let mut left = spec.rows;
    for day in 0..spec.days {
        let n = per_day.min(left);
        left -= n;
        let rows: Vec<Row> = (0..n).map(|_| row(&world, &mut rng)).collect();
        logits.extend(rows.iter().map(|r| r.logit as f32));
        labels.extend(rows.iter().map(|r| u8::from(r.click)));
        let path = if spec.csv {
            let path = spec.out.join(format!("day_{day}.csv"));
            write_csv(&path, &rows, &world)?;
            path
        } else {
            let path = spec.out.join(format!("day_{day}.parquet"));
            write_file(&path, &rows, &world)?;
            path
        };
        files.push(path);
    }
    let clicks = labels.iter().filter(|&&l| l == 1).count();
    Ok(NamedReport {
        files,
        rows: spec.rows,
        click_rate: clicks as f64 / spec.rows as f64,
        teacher_auc: super::exact_auc(&logits, &labels).unwrap_or(0.5),
    })
}
