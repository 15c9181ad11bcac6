//! The font weft's PNG plots are drawn with: DejaVu Sans (Debian's `fonts-dejavu-core`
//! 2.37-6, its licence in `fonts/LICENSE-DejaVu`), built into the binary and registered with
//! plotters' own TrueType support (its `ab_glyph` feature), so no font file or system font is
//! looked for at run time. It is its own crate because every crate that draws a plot needs it
//! and nothing else of one another (the p2p heat map of weft-bench, the scaling report of
//! weft-llmbench).
//!
//! It is not a layout engine: text is placed by its top-left corner (or, turned, by the
//! top-left corner of its turned box) and measured with [`text_size`].
//!
//! ```no_run
//! use plotters::prelude::*;
//! let root = BitMapBackend::new("x.png", (200, 40)).into_drawing_area();
//! root.fill(&WHITE).unwrap();
//! weft_font::draw_text(&root, "tg64 t/s", (4, 4), 16, false, &BLACK).unwrap();
//! root.present().unwrap();
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{FontFamily, FontStyle, FontTransform, register_font};

/// The family name the font is registered under.
pub const FAMILY: &str = "weft-dejavu-sans";

/// DejaVu Sans Book.
static TTF: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

/// Why text could not be drawn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FontError {
    /// The font built in is not a font plotters can read (never, which a test checks).
    #[error("the built-in font (DejaVu Sans) could not be read")]
    Unreadable,
    /// The drawing backend refused the text (plotters' message; its error type is the
    /// backend's, so it is kept as text).
    #[error("cannot draw the text `{text}`: {cause}")]
    Draw {
        /// The text that was to be drawn.
        text: String,
        /// The backend's message.
        cause: String,
    },
}

/// Registers the font with plotters once; `Err` when its bytes are not a font (never, for
/// the file built in, which a test checks).
pub fn register() -> Result<(), FontError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| register_font(FAMILY, FontStyle::Normal, TTF).is_ok());
    if ok {
        Ok(())
    } else {
        Err(FontError::Unreadable)
    }
}

/// plotters draws a line of text `px` high with its baseline at half a line below the point
/// it is given, so ascenders reach above it; this moves the point so the tallest glyphs
/// start at the top of the box.
fn top_offset(px: u32) -> i32 {
    (f64::from(px) * 0.2).round() as i32
}

fn font(px: u32) -> FontDesc<'static> {
    FontDesc::new(FontFamily::Name(FAMILY), f64::from(px), FontStyle::Normal)
}

/// Width and height in pixels of `s` drawn `px` high (the height is `px`, room for
/// ascenders and descenders).
pub fn text_size(s: &str, px: u32) -> (i32, i32) {
    if register().is_err() {
        return (0, px as i32);
    }
    let w = font(px).box_size(s).map_or(0, |(w, _)| w as i32);
    (w, px as i32)
}

/// Draws `s`, `px` high, with the top-left corner of its box at `at`; `turned`: read from
/// bottom to top, the box (`px` wide, as tall as the text is long) with its top-left corner
/// at `at`.
pub fn draw_text<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    s: &str,
    at: (i32, i32),
    px: u32,
    turned: bool,
    colour: &RGBColor,
) -> Result<(), FontError> {
    register()?;
    let (w, _) = text_size(s, px);
    let off = top_offset(px);
    let (style, pos) = if turned {
        (
            font(px).transform(FontTransform::Rotate270).color(colour),
            (at.0 + off, at.1 + w),
        )
    } else {
        (font(px).color(colour), (at.0, at.1 + off))
    };
    area.draw(&Text::new(s.to_string(), pos, style))
        .map_err(|e| FontError::Draw {
            text: s.to_string(),
            cause: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in font reads, measures as a proportional font does, and draws ink inside
    /// the box it says, turned or not.
    #[test]
    fn the_built_in_font_draws_inside_its_box() {
        register().unwrap();
        let (w_i, h) = text_size("iiii", 20);
        let (w_m, _) = text_size("MMMM", 20);
        assert_eq!(h, 20);
        assert!(w_i > 0 && w_m > 2 * w_i, "{w_i} {w_m}");
        for turned in [false, true] {
            let (bw, bh) = (120u32, 120u32);
            let mut buf = vec![255u8; (bw * bh * 3) as usize];
            {
                let root = BitMapBackend::with_buffer(&mut buf, (bw, bh)).into_drawing_area();
                draw_text(&root, "tg64 Wj", (10, 10), 20, turned, &BLACK).unwrap();
                root.present().unwrap();
            }
            let (tw, th) = text_size("tg64 Wj", 20);
            let (bx, by) = if turned { (th, tw) } else { (tw, th) };
            let mut inked = 0;
            for y in 0..bh as i32 {
                for x in 0..bw as i32 {
                    let i = ((y * bw as i32 + x) * 3) as usize;
                    if buf[i] < 128 {
                        inked += 1;
                        assert!(
                            (9..=10 + bx).contains(&x) && (9..=10 + by).contains(&y),
                            "turned {turned}: ink at ({x}, {y}) outside the box {bx}x{by} at (10, 10)"
                        );
                    }
                }
            }
            assert!(inked > 50, "turned {turned}: {inked} dark pixels");
        }
    }
}
