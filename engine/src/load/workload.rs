//! The workload file (docs/workload.md): TOML -> a validated, index-based model.
//!
//! Every error names the file, the line and the thing (state, page, field) at fault.

use std::path::Path;
use std::sync::Arc;

mod error;
mod model;
mod parse;
mod source;

pub use error::WorkloadError;
pub use model::*;
pub use parse::parse;

/// Read and parse a workload file.
pub fn load(path: &Path) -> Result<Workload, WorkloadError> {
    let text = std::fs::read_to_string(path).map_err(|error| WorkloadError::Read { file: path.to_path_buf(), error })?;
    parse(&text, path)
}

/// Words for generated text when no dictionary is given.
pub fn builtin_words() -> Arc<Vec<String>> {
    const W: &str = "the of and to in is that for it as was with be by on not he this are or his from at which but have an \
they you were her she there one all we their can has more been when who will no if out so said what up its about into than \
them only other new some could time these two may then do first any my now such like our over man me even most made after \
also did many before must through back years where much your way well down should because each just those people how too \
little state good very make world still own see men work long get here between both life being under never day same another \
know while last might us great old year off come since against go came right used take three story comment server browser";
    Arc::new(W.split_whitespace().map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[workload]\nstart = \"A\"\n[[pages]]\nname = \"A\"\nurl = \"/a\"\n";

    fn err(text: &str) -> String {
        parse(text, Path::new("w.toml")).unwrap_err().to_string()
    }

    #[test]
    fn embedded_section_defaults_and_errors() {
        let wl = parse(BASE, Path::new("w.toml")).unwrap();
        assert!(wl.embedded.is_none());
        let wl = parse(&format!("{BASE}[embedded]\n"), Path::new("w.toml")).unwrap();
        let e = wl.embedded.as_ref().unwrap();
        assert_eq!((e.connections, e.max_objects), (4, 64));
        assert!(wl.needs_body());
        let wl = parse(&format!("{BASE}[embedded]\nfetch = false\nconnections = 2\n"), Path::new("w.toml")).unwrap();
        assert!(wl.embedded.is_none());
        let wl = parse(&format!("{BASE}[embedded]\nconnections = 2\nmax_objects = 8\npattern = 'src=\"([^\"]+)\"'\n"), Path::new("w.toml")).unwrap();
        let e = wl.embedded.unwrap();
        assert_eq!((e.connections, e.max_objects), (2, 8));
        assert!(err(&format!("{BASE}[embedded]\nconnections = 65\n")).contains("w.toml:7: [embedded] connections"));
        assert!(err(&format!("{BASE}[embedded]\nmax_objects = 100\n")).contains("[embedded] max_objects"));
        assert!(err(&format!("{BASE}[embedded]\npattern = 'src=\"[^\"]+\"'\n")).contains("capture group"));
        assert!(err(&format!("{BASE}[embedded]\nconection = 2\n")).contains("unknown key 'conection'"));
    }

    #[test]
    fn session_minimum_duration_keys() {
        let wl = parse(&BASE.replace("start = \"A\"", "start = \"A\"\nsession_min_mean_s = 900\n"), Path::new("w.toml")).unwrap();
        assert_eq!((wl.session_min_mean_s, wl.session_min_max_s), (900.0, 3600.0));
        let wl =
            parse(&BASE.replace("start = \"A\"", "start = \"A\"\nsession_min_mean_s = 60\nsession_min_max_s = 100\n"), Path::new("w.toml")).unwrap();
        assert_eq!((wl.session_min_mean_s, wl.session_min_max_s), (60.0, 100.0));
        assert_eq!(parse(BASE, Path::new("w.toml")).unwrap().session_min_mean_s, 0.0);
    }

    #[test]
    fn variants_and_learn_variables() {
        let text = r#"[workload]
start = "S"
[session_vars]
C_ID = { nurand = [1023, 1, 2880], blank = 0.2, learn = 'C_ID=(\d+)' }
SHOPPING_ID = { learn = 'SHOPPING_ID=(\d+)' }
[[pages]]
name = "S"
url = "/s?t={search_type}&q={search_string}&c={C_ID}"
[[pages.variants]]
weight = 2
params = { search_type = "author", search_string = { digsyl = { nurand = [511, 0, 1000] }, syllables = 7 } }
[[pages.variants]]
params = { search_type = "subject", search_string = { choice = ["ARTS", "TRAVEL"] } }
"#;
        let wl = parse(text, Path::new("w.toml")).unwrap();
        assert_eq!(wl.pages[0].variants.len(), 2);
        assert_eq!(wl.pages[0].variants[0].weight, 2.0);
        assert!(wl.needs_body()); // learn reads bodies
                                  // a placeholder only some variants give is an error
        let bad = text.replace("params = { search_type = \"subject\", search_string", "params = { search_type = \"subject\", other");
        assert!(err(&bad).contains("placeholder {search_string}"), "{}", err(&bad));
        // learn in a page parameter is an error
        let bad = text.replace("search_type = \"author\",", "search_type = { learn = 'x(y)' },");
        assert!(err(&bad).contains("only possible for session variables"), "{}", err(&bad));
        // a parameter's error (load::params::ParamError) comes with the file, the line, the page and the key
        let bad = text.replace("syllables = 7", "syllables = 70");
        assert_eq!(err(&bad), "w.toml:7: page 'S' variant 1 params.search_string: digsyl syllables: expected an integer in [0, 20], got 70");
        let bad = text.replace("blank = 0.2,", "blank = 0.2, lower = 1,");
        assert_eq!(err(&bad), "w.toml:4: session variable 'C_ID': lower: expected true or false, got 1");
    }
}
