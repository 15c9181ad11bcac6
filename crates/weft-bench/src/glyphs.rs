//! A tiny built-in 5x7 bitmap font, for the labels of the p2p heat map without a font file
//! or a system font (plotters is built without its text features). Digits, letters (lower
//! case is drawn as upper case), space and `. - _ : / % ( ) , ? > = + @`; anything else is
//! drawn as `?`. Each glyph is 7 rows of 5 bits, the high bit the leftmost column; characters
//! are 6 columns apart.

/// Glyph width and height in font pixels.
pub const GLYPH_W: i32 = 5;
pub const GLYPH_H: i32 = 7;
/// Horizontal distance between characters, in font pixels.
pub const ADVANCE: i32 = GLYPH_W + 1;

/// The rows of `c`'s glyph.
pub fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_uppercase() {
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        'A' => [0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11],
        'B' => [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E],
        'C' => [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E],
        'D' => [0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C],
        'E' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F],
        'F' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10],
        'G' => [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F],
        'H' => [0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'I' => [0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F],
        'M' => [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'O' => [0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'P' => [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10],
        'Q' => [0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D],
        'R' => [0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11],
        'S' => [0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E],
        'T' => [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A],
        'X' => [0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04],
        'Z' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F],
        ' ' => [0; 7],
        '.' => [0, 0, 0, 0, 0, 0x0C, 0x0C],
        '-' => [0, 0, 0, 0x1F, 0, 0, 0],
        '_' => [0, 0, 0, 0, 0, 0, 0x1F],
        ':' => [0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0],
        '/' => [0, 0x01, 0x02, 0x04, 0x08, 0x10, 0],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        ',' => [0, 0, 0, 0, 0x0C, 0x04, 0x08],
        '>' => [0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08],
        '=' => [0, 0, 0x1F, 0, 0x1F, 0, 0],
        '+' => [0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0],
        '@' => [0x0E, 0x11, 0x17, 0x15, 0x17, 0x10, 0x0F],
        _ => [0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04],
    }
}

/// Width and height of `s` in font pixels (one line).
pub fn text_size(s: &str) -> (i32, i32) {
    let n = s.chars().count() as i32;
    ((n * ADVANCE - 1).max(0), GLYPH_H)
}

/// The lit font pixels of `s`, `(x, y)` from its top-left corner; `vertical` turns the text
/// 90 degrees counter-clockwise (it reads bottom to top, in a box `text_size.1` wide).
pub fn text_pixels(s: &str, vertical: bool) -> Vec<(i32, i32)> {
    let (w, _) = text_size(s);
    let mut v = Vec::new();
    for (k, c) in s.chars().enumerate() {
        let g = glyph(c);
        for (y, row) in g.iter().enumerate() {
            for x in 0..GLYPH_W {
                if row & (0x10 >> x) != 0 {
                    let px = k as i32 * ADVANCE + x;
                    let py = y as i32;
                    v.push(if vertical { (py, w - 1 - px) } else { (px, py) });
                }
            }
        }
    }
    v
}

/// Draws `s` at `(x, y)` (top-left of its box) on a plotters drawing area, each font pixel a
/// `scale` x `scale` square of `colour`.
pub fn draw_text<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    s: &str,
    (x, y): (i32, i32),
    scale: i32,
    vertical: bool,
    colour: &plotters::prelude::RGBColor,
) -> Result<(), String> {
    use plotters::prelude::{Color, Rectangle};
    for (px, py) in text_pixels(s, vertical) {
        let (x0, y0) = (x + px * scale, y + py * scale);
        area.draw(&Rectangle::new(
            [(x0, y0), (x0 + scale - 1, y0 + scale - 1)],
            colour.filled(),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_character_has_its_own_glyph() {
        let chars: Vec<char> = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ .-_:/%(),>=+@"
            .chars()
            .collect();
        for (i, a) in chars.iter().enumerate() {
            for b in &chars[i + 1..] {
                assert_ne!(glyph(*a), glyph(*b), "{a:?} and {b:?}");
            }
            assert!(glyph(*a).iter().all(|r| *r < 0x20), "{a:?} wider than 5");
        }
        assert_eq!(glyph('h'), glyph('H'));
        assert_eq!(glyph('~'), glyph('?'));
    }

    #[test]
    fn text_is_laid_out_left_to_right_or_bottom_to_top() {
        assert_eq!(text_size("10"), (11, 7));
        assert_eq!(text_size(""), (0, 7));
        // `-` is one row of 5 pixels, at row 3.
        assert_eq!(
            text_pixels("-", false),
            vec![(0, 3), (1, 3), (2, 3), (3, 3), (4, 3)]
        );
        // Turned: a column at x = 3, from the bottom (y = 4) to the top (y = 0).
        assert_eq!(
            text_pixels("-", true),
            vec![(3, 4), (3, 3), (3, 2), (3, 1), (3, 0)]
        );
        let a = text_pixels("h1", false);
        let b = text_pixels("h2", false);
        assert_ne!(a, b);
        // The second character starts 6 pixels to the right.
        assert!(
            a.iter()
                .all(|(x, y)| (0..11).contains(x) && (0..7).contains(y))
        );
        assert!(a.iter().any(|(x, _)| *x >= ADVANCE));
    }
}
