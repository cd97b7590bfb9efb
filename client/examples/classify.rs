//! Classify photos with a model of the repository and print the top-k with
//! class names — what an application does with kneepoint-client.
//!
//! ```sh
//! cargo run --release -p kneepoint-client --features image --example classify -- \
//!     10.77.0.2:9000 models 10 build/photos/coffee.png
//! ```
//!
//! Arguments: the platform's address, the model repository, the if_id, and
//! one or more PNG/JPEG files.

use std::error::Error;
use std::process::ExitCode;

use kneepoint_client::{image, labels::ModelInfo, Client};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("classify: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, models, if_id, photos @ ..] = args.as_slice() else {
        return Err("usage: classify ADDR MODELS_DIR IF_ID PHOTO...".into());
    };
    if photos.is_empty() {
        return Err("no photo given".into());
    }
    let client = Client::new(addr.as_str())?;
    // The model's input size and class names, from its config.toml.
    let model = ModelInfo::find(models, if_id.parse()?)?;
    let labels = model.labels()?;
    for photo in photos {
        let input = image::from_path(photo, model.height, model.width)?;
        let answer = client.infer(model.if_id, &input)?;
        println!("{photo}:");
        for c in &answer.top_k {
            let name = labels.get(c.class).unwrap_or("?");
            println!("  {:>4} {name:<24} {:.3}", c.class, c.score);
        }
    }
    Ok(())
}
