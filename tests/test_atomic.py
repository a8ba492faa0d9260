from opsynth.atomic import replacing, write_text_atomic


def test_a_file_written_atomically_is_whole_or_absent(tmp_path):
    target = tmp_path / "sub" / "f.txt"
    write_text_atomic(target, "one")
    try:
        with replacing(target) as tmp:
            tmp.write_text("half")
            raise OSError("disk full")
    except OSError:
        pass
    assert target.read_text() == "one"
    assert [p.name for p in target.parent.iterdir()] == ["f.txt"], "no temporary file left behind"
