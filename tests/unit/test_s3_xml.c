/*
 * tests/unit/test_s3_xml.c - ListObjectsV2 pages and <Error> bodies: normal
 * pages, truncation and tokens, escaped and non-ASCII keys, url encoding,
 * and hostile input (malformed, DTDs/entities, oversized).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3_xml.h"

#define HEAD "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
#define NS "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\""

static int parse(const char *xml, struct s3_list_page *p)
{
    return s3_xml_parse_list(xml, strlen(xml), p);
}

Test(s3_xml, list_page_with_contents_and_prefixes)
{
    const char *xml =
        HEAD "<ListBucketResult " NS "><Name>bkt</Name><Prefix>ckpt/</Prefix>"
             "<KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter>"
             "<IsTruncated>false</IsTruncated>"
             "<Contents><Key>ckpt/model.bin</Key><LastModified>2009-10-12T17:50:30.000Z"
             "</LastModified><ETag>&quot;fba9dede5f27731c9771645a39863328&quot;</ETag>"
             "<Size>434234</Size><StorageClass>STANDARD</StorageClass></Contents>"
             "<Contents><Key>ckpt/</Key><Size>0</Size></Contents>"
             "<CommonPrefixes><Prefix>ckpt/shards/</Prefix></CommonPrefixes>"
             "<CommonPrefixes><Prefix>ckpt/opt/</Prefix></CommonPrefixes>"
             "</ListBucketResult>";
    struct s3_list_page p;
    cr_assert_eq(parse(xml, &p), 0);
    cr_assert_eq(p.nobjects, 2);
    cr_expect_str_eq(p.objects[0].key, "ckpt/model.bin");
    cr_expect_eq(p.objects[0].size, 434234);
    cr_expect_eq(p.objects[0].mtime, 1255369830);
    cr_expect_str_eq(p.objects[0].etag, "\"fba9dede5f27731c9771645a39863328\"");
    cr_expect_str_eq(p.objects[1].key, "ckpt/");
    cr_expect_eq(p.objects[1].mtime, 0);
    cr_expect_str_eq(p.objects[1].etag, "");
    cr_assert_eq(p.nprefixes, 2);
    cr_expect_str_eq(p.prefixes[0], "ckpt/shards/");
    cr_expect_str_eq(p.prefixes[1], "ckpt/opt/");
    cr_expect_eq(p.is_truncated, 0);
    cr_expect_null(p.next_token);
    s3_list_page_free(&p);
}

Test(s3_xml, truncated_page_with_token)
{
    const char *xml = HEAD "<ListBucketResult " NS "><IsTruncated>true</IsTruncated>"
                           "<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="
                           "</NextContinuationToken>"
                           "<Contents><Key>a</Key><Size>1</Size></Contents></ListBucketResult>";
    struct s3_list_page p;
    cr_assert_eq(parse(xml, &p), 0);
    cr_expect_eq(p.is_truncated, 1);
    cr_expect_str_eq(p.next_token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
    s3_list_page_free(&p);
}

Test(s3_xml, truncated_without_token_is_rejected)
{
    const char *xml = HEAD "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>";
    struct s3_list_page p;
    cr_expect_eq(parse(xml, &p), -EINVAL);
    cr_expect_eq(p.nobjects, 0);
}

Test(s3_xml, empty_listing)
{
    struct s3_list_page p;
    cr_assert_eq(parse(HEAD "<ListBucketResult " NS "><KeyCount>0</KeyCount>"
                            "<IsTruncated>false</IsTruncated></ListBucketResult>",
                       &p),
                 0);
    cr_expect_eq(p.nobjects, 0);
    cr_expect_eq(p.nprefixes, 0);
    s3_list_page_free(&p);
}

Test(s3_xml, escaped_and_non_ascii_keys)
{
    const char *xml = HEAD "<ListBucketResult " NS "><IsTruncated>false</IsTruncated>"
                           "<Contents><Key>d/a&amp;b&lt;c&gt;&apos;&quot;.txt</Key><Size>3</Size>"
                           "</Contents>"
                           "<Contents><Key>d/\xc3\xbc\xc3\xb1 \xe6\x97\xa5&#x672C;.bin</Key>"
                           "<Size>4</Size></Contents>"
                           "<Contents><Key><![CDATA[d/x&y]]></Key><Size>5</Size></Contents>"
                           "<CommonPrefixes><Prefix>d/sp ace+plus/</Prefix></CommonPrefixes>"
                           "</ListBucketResult>";
    struct s3_list_page p;
    cr_assert_eq(parse(xml, &p), 0);
    cr_assert_eq(p.nobjects, 3);
    cr_expect_str_eq(p.objects[0].key, "d/a&b<c>'\".txt");
    cr_expect_str_eq(p.objects[1].key, "d/\xc3\xbc\xc3\xb1 \xe6\x97\xa5\xe6\x9c\xac.bin");
    cr_expect_str_eq(p.objects[2].key, "d/x&y");
    cr_expect_str_eq(p.prefixes[0], "d/sp ace+plus/");
    s3_list_page_free(&p);
}

Test(s3_xml, url_encoding_type_is_decoded)
{
    const char *xml = HEAD "<ListBucketResult " NS "><EncodingType>url</EncodingType>"
                           "<IsTruncated>false</IsTruncated>"
                           "<Contents><Key>d/a+b%2Bc%26%0A.txt</Key><Size>1</Size></Contents>"
                           "<CommonPrefixes><Prefix>d/%C3%BC/</Prefix></CommonPrefixes>"
                           "</ListBucketResult>";
    struct s3_list_page p;
    cr_assert_eq(parse(xml, &p), 0);
    cr_expect_str_eq(p.objects[0].key, "d/a b+c&\n.txt");
    cr_expect_str_eq(p.prefixes[0], "d/\xc3\xbc/");
    s3_list_page_free(&p);
    const char *bad = HEAD "<ListBucketResult><EncodingType>url</EncodingType>"
                           "<Contents><Key>a%00b</Key><Size>1</Size></Contents></ListBucketResult>";
    cr_expect_eq(parse(bad, &p), -EINVAL);
}

Test(s3_xml, bad_fields_are_rejected)
{
    struct s3_list_page p;
    cr_expect_eq(
        parse("<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>", &p),
        -EINVAL, "Contents without Key");
    cr_expect_eq(parse("<ListBucketResult><Contents><Key>a</Key><Size>-1</Size></Contents>"
                       "</ListBucketResult>",
                       &p),
                 -EINVAL, "negative size");
    cr_expect_eq(parse("<ListBucketResult><Contents><Key>a</Key><Size>12x</Size></Contents>"
                       "</ListBucketResult>",
                       &p),
                 -EINVAL);
    cr_expect_eq(
        parse("<ListBucketResult><CommonPrefixes></CommonPrefixes></ListBucketResult>", &p),
        -EINVAL, "CommonPrefixes without Prefix");
}

Test(s3_xml, malformed_and_wrong_documents)
{
    struct s3_list_page p;
    cr_expect_eq(parse("", &p), -EINVAL);
    cr_expect_eq(parse("<ListBucketResult><Contents><Key>a</Key>", &p), -EINVAL);
    cr_expect_eq(parse("<html><body>Hello</body></html>", &p), -EINVAL);
    cr_expect_eq(parse("not xml at all", &p), -EINVAL);
    cr_expect_eq(parse(HEAD "<Error><Code>NoSuchBucket</Code></Error>", &p), -EINVAL);
    cr_expect_eq(s3_xml_parse_list(NULL, 0, &p), -EINVAL);
}

Test(s3_xml, entities_and_dtds_are_refused)
{
    const char *laughs =
        "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\">"
        "<!ENTITY lol2 \"&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;\">"
        "<!ENTITY lol3 \"&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;\">]>"
        "<ListBucketResult><Contents><Key>&lol3;</Key><Size>1</Size></Contents>"
        "</ListBucketResult>";
    struct s3_list_page p;
    cr_expect_eq(parse(laughs, &p), -EINVAL);
    const char *xxe = "<?xml version=\"1.0\"?><!DOCTYPE x [<!ENTITY e SYSTEM "
                      "\"file:///etc/passwd\">]><ListBucketResult><Contents><Key>&e;</Key>"
                      "<Size>1</Size></Contents></ListBucketResult>";
    cr_expect_eq(parse(xxe, &p), -EINVAL);
    struct s3_error_body e;
    const char *err_xxe = "<!DOCTYPE x [<!ENTITY e SYSTEM \"file:///etc/passwd\">]>"
                          "<Error><Code>&e;</Code></Error>";
    cr_expect_eq(s3_xml_parse_error(err_xxe, strlen(err_xxe), &e), -EINVAL);
    cr_expect_str_eq(e.code, "");
}

Test(s3_xml, oversized_input_is_refused)
{
    size_t n = S3_XML_MAX_BYTES + 1;
    char *big = malloc(n);
    cr_assert_not_null(big);
    memset(big, ' ', n);
    memcpy(big, "<ListBucketResult>", 18);
    struct s3_list_page p;
    cr_expect_eq(s3_xml_parse_list(big, n, &p), -EFBIG);
    struct s3_error_body e;
    cr_expect_eq(s3_xml_parse_error(big, n, &e), -EFBIG);
    free(big);
}

Test(s3_xml, many_entries)
{
    size_t cap = 200000, len = 0;
    char *xml = malloc(cap);
    len += (size_t)snprintf(xml + len, cap - len, "<ListBucketResult>");
    for (int i = 0; i < 1000; i++)
        len += (size_t)snprintf(xml + len, cap - len,
                                "<Contents><Key>d/k%04d</Key><Size>%d</Size></Contents>", i, i);
    len += (size_t)snprintf(xml + len, cap - len, "</ListBucketResult>");
    struct s3_list_page p;
    cr_assert_eq(s3_xml_parse_list(xml, len, &p), 0);
    cr_expect_eq(p.nobjects, 1000);
    cr_expect_str_eq(p.objects[999].key, "d/k0999");
    cr_expect_eq(p.objects[999].size, 999);
    s3_list_page_free(&p);
    free(xml);
}

Test(s3_xml, error_body)
{
    const char *xml = HEAD "<Error><Code>NoSuchKey</Code><Message>The resource you requested does "
                           "not exist</Message><Resource>/mybucket/myfoto.jpg</Resource>"
                           "<RequestId>4442587FB7D0A2F9</RequestId></Error>";
    struct s3_error_body e;
    cr_assert_eq(s3_xml_parse_error(xml, strlen(xml), &e), 0);
    cr_expect_str_eq(e.code, "NoSuchKey");
    cr_expect_str_eq(e.message, "The resource you requested does not exist");
    cr_expect_str_eq(e.request_id, "4442587FB7D0A2F9");
    cr_expect_str_eq(e.region, "");
}

Test(s3_xml, error_body_region_and_sanitizing)
{
    const char *xml = "<Error><Code>AuthorizationHeaderMalformed</Code><Message>line1\nline2\t"
                      "</Message><Region>eu-west-1</Region><RequestId>R</RequestId></Error>";
    struct s3_error_body e;
    cr_assert_eq(s3_xml_parse_error(xml, strlen(xml), &e), 0);
    cr_expect_str_eq(e.region, "eu-west-1");
    cr_expect_str_eq(e.message, "line1 line2 ");
}

Test(s3_xml, error_body_long_fields_truncated)
{
    char xml[2048];
    char code[300];
    memset(code, 'C', sizeof code - 1);
    code[sizeof code - 1] = '\0';
    snprintf(xml, sizeof xml, "<Error><Code>%s</Code></Error>", code);
    struct s3_error_body e;
    cr_assert_eq(s3_xml_parse_error(xml, strlen(xml), &e), 0);
    cr_expect_eq(strlen(e.code), sizeof e.code - 1);
}

Test(s3_xml, error_body_malformed)
{
    struct s3_error_body e;
    cr_expect_eq(s3_xml_parse_error("<Error><Code>x", 14, &e), -EINVAL);
    cr_expect_eq(s3_xml_parse_error("<ListBucketResult/>", 19, &e), -EINVAL);
    cr_expect_eq(s3_xml_parse_error("", 0, &e), -EINVAL);
}

Test(s3_xml, iso8601)
{
    cr_expect_eq(s3_parse_iso8601("2009-10-12T17:50:30.000Z"), 1255369830);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T17:50:30Z"), 1255369830);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T17:50:30"), 1255369830);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T19:50:30.5+02:00"), 1255369830);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T16:50:30-0100"), 1255369830);
    cr_expect_eq(s3_parse_iso8601("1970-01-01T00:00:00.000Z"), 0);
    cr_expect_eq(s3_parse_iso8601("2009-13-12T17:50:30Z"), -1);
    cr_expect_eq(s3_parse_iso8601("2009-10-12 17:50:30Z"), -1);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T17:50:30.Z"), -1);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T17:50:30Zjunk"), -1);
    cr_expect_eq(s3_parse_iso8601(""), -1);
    cr_expect_eq(s3_parse_iso8601(NULL), -1);
}
